variable "name" {
  description = "Deployment name."
  type        = string
}

variable "kms_key_arn" {
  description = "Key encrypting the alarm topic."
  type        = string
}

variable "alarm_emails" {
  description = "Addresses subscribed to the alarm topic (each must confirm)."
  type        = list(string)
  default     = []
}

variable "alb_arn_suffix" {
  description = "Load balancer dimension of the ALB metrics."
  type        = string
}

variable "target_group_arn_suffix" {
  description = "Target group dimension of the ALB metrics."
  type        = string
}

variable "ecs_cluster_name" {
  description = "ECS cluster of the edge."
  type        = string
}

variable "ecs_service_name" {
  description = "ECS service of the edge."
  type        = string
}

variable "gpu_groups" {
  description = "Model name => its GPU Auto Scaling group's name."
  type        = map(string)
}

variable "metric_namespace" {
  description = "Namespace of the scaling metric (module scaling_metric)."
  type        = string
}

variable "demand_metric" {
  description = "The edges' demand per replica (module scaling_metric)."
  type        = string
}

variable "replica_load_metric" {
  description = "The replicas' reported load per replica (module scaling_metric)."
  type        = string
}

variable "metric_model_dimension" {
  description = "Dimension carrying the model's name (module scaling_metric)."
  type        = string
}

variable "metric_period_s" {
  description = "Aggregation period of the scaling metric (module scaling_metric)."
  type        = number
}

variable "metric_samples_per_period" {
  description = "Samples per period each edge sends (module scaling_metric)."
  type        = number
}

variable "demand_alarm" {
  description = "Demand per replica (1.0: every sequence of every replica wanted) that pages someone when it lasts 10 minutes: scaling is not keeping up (GPU quota, max_size)."
  type        = number
  default     = 2
}

variable "error_rate_alarm_percent" {
  description = "5xx answers, load balancer and edge together, as a percentage of requests, over 5 minutes."
  type        = number
  default     = 2
}
