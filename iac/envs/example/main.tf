# An example environment: one region, one API domain, the GPU pools of var.models.

locals {
  account_id    = data.aws_caller_identity.current.account_id
  bucket_suffix = "${local.account_id}-${var.region}"
  # Named here, not read from the pools: the edge needs them and the pools need the edge's group.
  # AWS names take fewer characters than model names (a lifecycle hook's only [A-Za-z0-9-_/], and
  # the group names its hooks), so the group is named from the model's name with every other
  # character made a '-': "llama-3.1-8b" runs on "floodgate-gpu-llama-3-1-8b". The model keeps its
  # own name everywhere else: the edge's settings, the scaling metric's Model dimension, the tags.
  # var.models refuses two names that would share a group.
  gpu_groups = { for model in keys(var.models) : model => "${var.name}-gpu-${replace(model, "/[^A-Za-z0-9_-]/", "-")}" }
  # The edge's [models.NAME]: each model's replicas are the in-service hosts of its own GPU group.
  edge_models = {
    for model, spec in var.models : model => {
      path         = spec.edge_model_dir != "" ? spec.edge_model_dir : var.edge_model_dir
      gpu_group    = local.gpu_groups[model]
      token_weight = spec.token_weight
      # Its TensorRT-LLM engine's context, not the edge's CPU engine's [engine] max_model_len.
      max_model_len = spec.max_model_len
      # null: the edge's [metrics] prices (one H200 serving Llama 3.3 70B).
      prefill_s_per_token = spec.prefill_s_per_token
      decode_s_per_token  = spec.decode_s_per_token
    }
  }
}

data "aws_caller_identity" "current" {}

module "scaling_metric" {
  source = "../../modules/scaling_metric"
}

module "kms" {
  source                                 = "../../modules/kms_key"
  name                                   = var.name
  create_autoscaling_service_linked_role = var.create_autoscaling_service_linked_role
}

module "network" {
  source              = "../../modules/network"
  name                = var.name
  availability_zones  = var.availability_zones
  single_nat_gateway  = var.single_nat_gateway
  kms_key_arn         = module.kms.key_arn
  interface_endpoints = var.interface_endpoints
  log_retention_days  = var.log_retention_days
}

module "logs" {
  source = "../../modules/log_bucket"
  name   = "${var.name}-logs-${local.bucket_suffix}"
}

module "alb" {
  source              = "../../modules/alb"
  name                = var.name
  vpc_id              = module.network.vpc_id
  public_subnet_ids   = module.network.public_subnet_ids
  domain_name         = var.domain_name
  route53_zone_id     = var.route53_zone_id
  log_bucket          = module.logs.bucket
  log_prefix          = module.logs.alb_prefix
  kms_key_arn         = module.kms.key_arn
  deletion_protection = var.deletion_protection
  log_retention_days  = var.log_retention_days
  # The edge's drain_deadline_s is rendered from the same value (the edge's settings below).
  deregistration_delay_s = var.deregistration_delay_s
}

module "edge_registry" {
  source      = "../../modules/container_registry"
  name        = "${var.name}/edge"
  kms_key_arn = module.kms.key_arn
  # The deployed image is never expired by the registry's count.
  protected_tags = [var.edge_image_tag]
}

module "triton_registry" {
  source      = "../../modules/container_registry"
  name        = "${var.name}/triton-trtllm"
  kms_key_arn = module.kms.key_arn
  # The deployed image is never expired by the registry's count.
  protected_tags = [var.triton_image_tag]
}

module "engines" {
  source                  = "../../modules/engine_bucket"
  name                    = "${var.name}-engines-${local.bucket_suffix}"
  kms_key_arn             = module.kms.key_arn
  log_bucket              = module.logs.bucket
  log_prefix              = module.logs.s3_prefix
  noncurrent_version_days = var.noncurrent_version_days
}

module "messages" {
  source      = "../../modules/messages_table"
  name        = "${var.name}-messages"
  kms_key_arn = module.kms.key_arn
}

# API keys (hashes) and usage per user, shared by every edge task (edge/keys, edge/usage).
module "keys" {
  source             = "../../modules/keys_table"
  name               = "${var.name}-keys"
  kms_key_arn        = module.kms.key_arn
  edge_task_role_arn = module.edge.task_role_arn
}

module "redis" {
  source                    = "../../modules/redis"
  name                      = var.name
  vpc_id                    = module.network.vpc_id
  private_subnet_ids        = module.network.private_subnet_ids
  client_security_group_ids = [module.edge.security_group_id]
  node_type                 = var.redis_node_type
  shards                    = var.redis_shards
  kms_key_arn               = module.kms.key_arn
  log_retention_days        = var.log_retention_days
}

module "edge" {
  source                = "../../modules/edge_service"
  name                  = var.name
  vpc_id                = module.network.vpc_id
  vpc_cidr_block        = module.network.vpc_cidr_block
  private_subnet_ids    = module.network.private_subnet_ids
  alb_security_group_id = module.alb.security_group_id
  target_group_arn      = module.alb.target_group_arn
  image                 = "${module.edge_registry.url}:${var.edge_image_tag}"
  ecr_repository_arn    = module.edge_registry.arn
  min_count             = var.edge_min_count
  max_count             = var.edge_max_count
  redis_auth_secret_arn = module.redis.auth_secret_arn
  messages_table_arn    = module.messages.arn
  metric_namespace      = module.scaling_metric.namespace
  kms_key_arn           = module.kms.key_arn
  log_retention_days    = var.log_retention_days
  # Operators scrape /metrics on the tasks' operator port from these groups (none: unreachable).
  metrics_scraper_security_group_ids = var.metrics_scraper_security_group_ids
  # The edge serves every model, each from its own GPU group, to the tiers tier_models names.
  config_toml = templatefile("${path.module}/edge.toml.tftpl", {
    models         = local.edge_models
    tier_models    = var.tier_models
    redis_endpoint = module.redis.configuration_endpoint
    # Exact while the service runs edge_min_count tasks; see the template for the trade-off.
    edge_instances = var.edge_min_count
    messages_table = module.messages.name
    keys_table     = module.keys.name
    region         = var.region
    # Above the ALB's idle timeout, so the ALB, not the edge, closes an idle connection between them.
    http_keep_alive_s = module.alb.idle_timeout_s + 5
    # The operator listener, on the port the task declares and its security group opens.
    ops_port = module.edge.ops_port
    # Streams get as long after SIGTERM as the load balancer gives them after deregistration.
    drain_deadline_s = var.deregistration_delay_s
    # Each replica divided among this many edge processes (0: all of them): var.members_per_replica.
    members_per_replica = var.members_per_replica
  })
}

module "gpu_pool" {
  source   = "../../modules/gpu_pool"
  for_each = var.models

  group_name             = local.gpu_groups[each.key]
  model                  = each.key
  vpc_id                 = module.network.vpc_id
  private_subnet_ids     = module.network.private_subnet_ids
  edge_security_group_id = module.edge.security_group_id
  instance_type          = each.value.instance_type
  min_size               = each.value.min_size
  max_size               = each.value.max_size
  warm_pool_min_size     = each.value.warm_pool_min_size
  demand_target          = each.value.demand_target
  ami_id                 = each.value.ami_id
  triton_image           = "${module.triton_registry.url}:${var.triton_image_tag}"
  ecr_repository_arn     = module.triton_registry.arn
  engine_bucket_arn      = module.engines.arn
  engine_s3_uri          = "s3://${module.engines.bucket}/${each.value.engine_prefix}"
  kms_key_arn            = module.kms.key_arn

  # null: the module's defaults, provisioned for re-reading the engine at a warm start.
  root_volume_gb               = each.value.root_volume_gb
  root_volume_iops             = each.value.root_volume_iops
  root_volume_throughput_mibps = each.value.root_volume_throughput_mibps

  # null: the module's defaults (surge 1.5, drain 600 s, apply waits "30m").
  surge_demand              = each.value.surge_demand
  scale_in_drain_s          = each.value.scale_in_drain_s
  wait_for_capacity_timeout = each.value.wait_for_capacity_timeout
  log_retention_days        = var.log_retention_days

  metric_namespace          = module.scaling_metric.namespace
  demand_metric             = module.scaling_metric.demand_metric
  replica_load_metric       = module.scaling_metric.replica_load_metric
  metric_model_dimension    = module.scaling_metric.model_dimension
  metric_period_s           = module.scaling_metric.period_s
  metric_samples_per_period = module.scaling_metric.samples_per_period
}

module "monitoring" {
  source                  = "../../modules/monitoring"
  name                    = var.name
  kms_key_arn             = module.kms.key_arn
  alarm_emails            = var.alarm_emails
  alb_arn_suffix          = module.alb.arn_suffix
  target_group_arn_suffix = module.alb.target_group_arn_suffix
  ecs_cluster_name        = module.edge.cluster_name
  ecs_service_name        = module.edge.service_name
  gpu_groups              = { for model, pool in module.gpu_pool : model => pool.autoscaling_group_name }

  metric_namespace          = module.scaling_metric.namespace
  demand_metric             = module.scaling_metric.demand_metric
  replica_load_metric       = module.scaling_metric.replica_load_metric
  metric_model_dimension    = module.scaling_metric.model_dimension
  metric_period_s           = module.scaling_metric.period_s
  metric_samples_per_period = module.scaling_metric.samples_per_period
}
