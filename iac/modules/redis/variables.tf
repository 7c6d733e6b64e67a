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
  description = "Node groups of the cluster (1 to 500); each user's keys share a hash tag, so users spread over shards."
  type        = number
  default     = 2

  # The provider leaves 0 out of CreateReplicationGroup (AWS makes one shard, and every later plan
  # tries to reshard it to none) and sends what else it is given: AWS refused a negative count, or
  # more than a cluster's 500, only at apply, the token secret and security group made.
  validation {
    condition     = var.shards >= 1 && var.shards <= 500 && floor(var.shards) == var.shards
    error_message = "shards must be a whole number from 1 to 500 (node groups of a Redis cluster)."
  }
}

variable "replicas_per_shard" {
  description = "Replicas of each shard, in other zones (failover target): 1 to 5."
  type        = number
  default     = 1

  # Automatic failover and Multi-AZ (main.tf) need a replica in every shard: AWS refused 0 only at
  # apply (the provider checks 0 to 5).
  validation {
    condition     = var.replicas_per_shard >= 1 && var.replicas_per_shard <= 5 && floor(var.replicas_per_shard) == var.replicas_per_shard
    error_message = "replicas_per_shard must be a whole number from 1 to 5: automatic failover and Multi-AZ need a replica in every shard."
  }
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
