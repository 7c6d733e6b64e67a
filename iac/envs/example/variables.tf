variable "region" {
  description = "AWS region (must offer the GPU instance types of var.models)."
  type        = string
  default     = "us-east-1"
}

variable "name" {
  description = "Deployment name, prefixed to every resource."
  type        = string
  default     = "floodgate"
}

variable "domain_name" {
  description = "Public name of the API, e.g. api.example.com."
  type        = string
}

variable "route53_zone_id" {
  description = "Route 53 hosted zone of domain_name."
  type        = string
}

variable "alarm_emails" {
  description = "Who gets the alarms."
  type        = list(string)
  default     = []
}

variable "edge_image_tag" {
  description = "Tag of the edge image pushed to the edge repository."
  type        = string
}

variable "triton_image_tag" {
  description = "Tag of the Triton + TensorRT-LLM image pushed to the triton repository."
  type        = string
}

variable "edge_model_dir" {
  description = "Where the edge image holds the served model's config.json and tokenizer files."
  type        = string
  default     = "/opt/floodgate/model"
}

variable "models" {
  description = "Served models: each gets its own GPU Auto Scaling group, scaled on its own demand (the metric's Model dimension), and its own [models.NAME] in the edge's settings. engine_prefix is the engine's key prefix in the engine bucket, built for instance_type's GPU. ami_id pins the GPU AMI (empty: the latest, read at plan time). min_size may be 0: the group then starts from zero on demand. edge_model_dir: where the edge image holds this model's config and tokenizer files (empty: edge_model_dir; with several models give each its own). token_weight: what each of its tokens counts against a user's token limit."
  type = map(object({
    instance_type      = string
    engine_prefix      = string
    min_size           = number
    max_size           = number
    warm_pool_min_size = number
    demand_target      = number
    ami_id             = optional(string, "")
    edge_model_dir     = optional(string, "")
    token_weight       = optional(number, 1)
  }))
  default = {
    "llama-3-8b" = {
      instance_type      = "g6e.xlarge"
      engine_prefix      = "engines/llama-3-8b/l40s/"
      min_size           = 1
      max_size           = 8
      warm_pool_min_size = 2
      demand_target      = 0.8
    }
  }
}

variable "availability_zones" {
  description = "Zones to span; pick zones that offer every GPU instance type in var.models."
  type        = list(string)
  default     = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

variable "single_nat_gateway" {
  description = "One NAT gateway instead of one per zone (cost lever for non-production)."
  type        = bool
  default     = false
}

variable "redis_node_type" {
  description = "ElastiCache node type of the limiter store."
  type        = string
  default     = "cache.r7g.large"
}

variable "redis_shards" {
  description = "Shards of the limiter store."
  type        = number
  default     = 2
}

variable "edge_min_count" {
  description = "Fewest edge tasks."
  type        = number
  default     = 2
}

variable "edge_max_count" {
  description = "Most edge tasks."
  type        = number
  default     = 40
}

variable "deletion_protection" {
  description = "Protect the load balancer from deletion (turn off before destroying)."
  type        = bool
  default     = true
}

variable "create_autoscaling_service_linked_role" {
  description = "Create the Auto Scaling service-linked role the KMS key policy names; false where the account already has one (any Auto Scaling group ever made creates it)."
  type        = bool
  default     = true
}

variable "tier_models" {
  description = "Tier => the models of var.models it may use (the first is its default). A tier not named here may use every model, the alphabetically first by default."
  type        = map(list(string))
  default     = {}

  validation {
    condition     = alltrue([for models in values(var.tier_models) : length(models) > 0])
    error_message = "Each tier in tier_models needs at least one model."
  }
}
