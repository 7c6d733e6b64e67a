output "api_url" {
  description = "Where clients send requests."
  value       = "https://${var.domain_name}/v1"
}

output "edge_repository_url" {
  description = "Push the edge image here."
  value       = module.edge_registry.url
}

output "triton_repository_url" {
  description = "Push the Triton + TensorRT-LLM image here."
  value       = module.triton_registry.url
}

output "api_keys_secret_arn" {
  description = "Put the hashed keys file here (floodgate keys create writes it), then restart the edge tasks (a new deployment of edge_service_name in edge_cluster_name)."
  value       = module.edge.api_keys_secret_arn
}

output "engine_bucket" {
  description = "Upload built engines here, under each model's engine_prefix."
  value       = module.engines.bucket
}

output "gpu_autoscaling_groups" {
  description = "Model => GPU Auto Scaling group."
  value       = { for model, pool in module.gpu_pool : model => pool.autoscaling_group_name }
}

output "dashboard" {
  description = "CloudWatch dashboard name."
  value       = module.monitoring.dashboard_name
}

output "keys_table" {
  description = "DynamoDB table of API keys and usage: name it in the settings file `floodgate keys` uses ([keys] backend = \"dynamodb\")."
  value       = module.keys.name
}

output "tier_models" {
  description = "Tier => the models it may use, its default first (tiers not named may use every model)."
  value       = var.tier_models

  # The edge refuses a tier naming a model it does not serve, and every task would crash-loop: here
  # the plan fails instead (var.tier_models cannot read var.models in a validation before 1.9).
  precondition {
    condition     = alltrue([for models in values(var.tier_models) : alltrue([for model in models : contains(keys(var.models), model)])])
    error_message = "tier_models names a model that is not in var.models."
  }
}

output "edge_ops_port" {
  description = "The edge tasks' operator port (/metrics, /v1/internal/engine) of their first worker, worker i's this + i (one worker per vCPU): reachable at each task's private IP from metrics_scraper_security_group_ids only."
  value       = module.edge.ops_port
}

output "edge_members_per_replica" {
  description = "The edge's [fleet] members_per_replica, var.members_per_replica (0: every edge process divides every replica)."
  value       = var.members_per_replica
}

# What an operator wires up or acts on after apply: the alarms reach e-mail only through
# alarm_emails, and a pager, chat or ticket integration subscribes to the topic; a change of the
# api-keys secret reaches the tasks only when they restart
# (`aws ecs update-service --cluster CLUSTER --service SERVICE --force-new-deployment`).
output "alarm_topic_arn" {
  description = "SNS topic every alarm goes to: subscribe a pager or chat integration here (alarm_emails are subscribed already)."
  value       = module.monitoring.alarm_topic_arn
}

output "edge_cluster_name" {
  description = "ECS cluster of the edge service."
  value       = module.edge.cluster_name
}

output "edge_service_name" {
  description = "ECS service of the edge tasks: force a new deployment of it to restart them (a new api-keys secret is read at task start)."
  value       = module.edge.service_name
}
