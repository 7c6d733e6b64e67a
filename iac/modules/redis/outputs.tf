output "configuration_endpoint" {
  description = "Cluster-mode configuration endpoint (use rediss://)."
  value       = aws_elasticache_replication_group.this.configuration_endpoint_address
}

output "auth_secret_arn" {
  description = "Secrets Manager secret holding the auth token."
  value       = aws_secretsmanager_secret.auth_token.arn
}

output "replication_group_id" {
  description = "Replication group id (for alarms)."
  value       = aws_elasticache_replication_group.this.id
}
