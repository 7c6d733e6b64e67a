output "security_group_id" {
  description = "The edge tasks' security group (Redis and the GPU hosts admit it)."
  value       = aws_security_group.edge.id
}

output "cluster_name" {
  description = "ECS cluster of the edge."
  value       = aws_ecs_cluster.this.name
}

output "service_name" {
  description = "ECS service of the edge."
  value       = aws_ecs_service.edge.name
}

output "api_keys_secret_arn" {
  description = "Secret holding the hashed API keys (keys.jsonl); tasks read it when they start."
  value       = aws_secretsmanager_secret.api_keys.arn
}

output "task_role_arn" {
  description = "Role the edge's code runs as."
  value       = aws_iam_role.task.arn
}

output "ops_port" {
  description = "Port of the edge's operator listener (/metrics, /v1/internal/engine) of the first worker, worker i's this + i; the settings must bind it ([server] ops_port)."
  value       = var.ops_port
}

output "workers" {
  description = "Edge processes per task (one per vCPU of var.cpu, `floodgate serve --workers`): each is a fleet member of its own, so the fleet's processes are the tasks times this."
  value       = local.workers
}
