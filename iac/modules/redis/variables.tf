variable "name" {
  description = "Deployment name."
  type        = string
}

variable "vpc_id" {
  description = "The VPC."
  type        = string
}

variable "private_subnet_ids" {
  description = "Subnets of the Redis nodes (one per zone: multi-AZ)."
  type        = list(string)
}

variable "client_security_group_ids" {
  description = "Security groups allowed to connect (the edge)."
  type        = list(string)
}

variable "node_type" {
  description = "Cache node type."
  type        = string
  default     = "cache.r7g.large"
}

variable "shards" {
  description = "Node groups of the cluster; each user's keys share a hash tag, so users spread over shards."
  type        = number
  default     = 2
}

variable "replicas_per_shard" {
  description = "Replicas of each shard, in other zones (failover target)."
  type        = number
  default     = 1
}

variable "kms_key_arn" {
  description = "Key for data at rest, the auth-token secret and the logs."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the slow log."
  type        = number
  default     = 365
}
