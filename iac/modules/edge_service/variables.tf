variable "name" {
  description = "Deployment name."
  type        = string
}

variable "vpc_id" {
  description = "The VPC."
  type        = string
}

variable "vpc_cidr_block" {
  description = "The VPC's range: Redis and the GPU hosts are reached inside it."
  type        = string
}

variable "private_subnet_ids" {
  description = "Subnets of the tasks."
  type        = list(string)
}

variable "alb_security_group_id" {
  description = "Only the load balancer may reach the tasks."
  type        = string
}

variable "target_group_arn" {
  description = "Target group the tasks register in."
  type        = string
}

variable "image" {
  description = "Edge container image (ECR URI with tag or digest)."
  type        = string
}

variable "ecr_repository_arn" {
  description = "ARN of the ECR repository `image` is in: the only repository the execution role may pull from."
  type        = string
}

variable "container_port" {
  description = "Port the edge listens on."
  type        = number
  default     = 8000
}

variable "ops_port" {
  description = "Port of the edge's operator listener ([server] ops_port: /metrics, /v1/internal/engine), which the load balancer never reaches; with several workers (one per vCPU), worker i's is ops_port + i."
  type        = number
  default     = 9464
}

variable "metrics_scraper_security_group_ids" {
  description = "Security groups (a Prometheus, an operator's bastion) the tasks admit on ops_port; empty: none, the operator listener is unreachable from outside the task."
  type        = list(string)
  default     = []
}

variable "cpu" {
  description = "Task CPU units (1024 = 1 vCPU). Tokenising and detokenising make the edge CPU-bound: the task runs one edge process (`floodgate serve --workers`) per vCPU, worker i's operator listener on ops_port + i."
  type        = number
  default     = 2048
}

variable "memory" {
  description = "Task memory in MiB."
  type        = number
  default     = 4096
}

variable "min_count" {
  description = "Fewest tasks (spread over the zones)."
  type        = number
  default     = 2
}

variable "max_count" {
  description = "Most tasks."
  type        = number
  default     = 40
}

variable "cpu_target_percent" {
  description = "Average CPU the service's target tracking holds."
  type        = number
  default     = 50
}

variable "config_toml" {
  description = "The edge's settings file (same shape as edge/defaults.toml). The literal @REDIS_AUTH_TOKEN@ is replaced at start with the token from Secrets Manager."
  type        = string
}

variable "environment" {
  description = "More environment variables of the edge container (no secrets: they show in the task definition)."
  type        = map(string)
  default     = {}
}

variable "redis_auth_secret_arn" {
  description = "Secrets Manager secret holding the Redis auth token."
  type        = string
}

variable "messages_table_arn" {
  description = "The DynamoDB table of conversation messages."
  type        = string
}

variable "metric_namespace" {
  description = "The only CloudWatch namespace the edge may publish to."
  type        = string
}

variable "kms_key_arn" {
  description = "Key of the logs, the table and the secret."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the container logs."
  type        = number
  default     = 365
}

variable "stop_timeout_s" {
  description = "Seconds a stopping task gets to finish its streams after SIGTERM (Fargate allows up to 120)."
  type        = number
  default     = 120
}
