# The limiter's shared store: Redis in cluster mode (all keys of one user share a hash tag, so the
# limiter's Lua steps stay on one shard), TLS in transit, encrypted at rest, an auth token kept in
# Secrets Manager, one replica per shard in another zone with automatic failover.

# Drawn once: the secret version ignores later draws (the data source changes on every plan).
data "aws_secretsmanager_random_password" "auth_token" {
  password_length     = 64
  exclude_punctuation = true
}

resource "aws_secretsmanager_secret" "auth_token" {
  #checkov:skip=CKV2_AWS_57:ElastiCache tokens rotate with auth_token_update_strategy (ROTATE then SET), not a Secrets Manager rotation Lambda
  name                    = "${var.name}/redis-auth-token"
  description             = "AUTH token of the limiter's Redis"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret_version" "auth_token" {
  secret_id     = aws_secretsmanager_secret.auth_token.id
  secret_string = data.aws_secretsmanager_random_password.auth_token.random_password

  lifecycle {
    ignore_changes = [secret_string]
  }
}

resource "aws_elasticache_subnet_group" "this" {
  name       = "${var.name}-redis"
  subnet_ids = var.private_subnet_ids
}

resource "aws_security_group" "redis" {
  name        = "${var.name}-redis"
  description = "Redis: TLS from the edge only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "Redis from the edge"
    from_port       = 6379
    to_port         = 6379
    protocol        = "tcp"
    security_groups = var.client_security_group_ids
  }
}

resource "aws_cloudwatch_log_group" "slow_log" {
  name              = "/floodgate/${var.name}/redis-slow-log"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

# The default groups evict under memory pressure (volatile-lru): every limiter key has a TTL, so
# Redis would silently delete users' counters and reset their limits. With noeviction a full
# Redis refuses writes instead, and the limiter's on_store_failure policy decides what happens.
resource "aws_elasticache_parameter_group" "limiter" {
  name        = "${var.name}-limiter"
  family      = "redis7"
  description = "Limiter store: cluster mode, never evict keys"

  parameter {
    name  = "cluster-enabled"
    value = "yes"
  }

  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = "${var.name}-limiter"
  description          = "Floodgate limiter store"
  engine               = "redis"
  engine_version       = "7.1"
  node_type            = var.node_type
  port                 = 6379
  parameter_group_name = aws_elasticache_parameter_group.limiter.name

  cluster_mode            = "enabled"
  num_node_groups         = var.shards
  replicas_per_node_group = var.replicas_per_shard

  automatic_failover_enabled = true
  multi_az_enabled           = true
  subnet_group_name          = aws_elasticache_subnet_group.this.name
  security_group_ids         = [aws_security_group.redis.id]

  at_rest_encryption_enabled = true
  kms_key_id                 = var.kms_key_arn
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = aws_secretsmanager_secret_version.auth_token.secret_string

  auto_minor_version_upgrade = true
  snapshot_retention_limit   = 1
  apply_immediately          = false

  log_delivery_configuration {
    destination      = aws_cloudwatch_log_group.slow_log.name
    destination_type = "cloudwatch-logs"
    log_format       = "json"
    log_type         = "slow-log"
  }
}
