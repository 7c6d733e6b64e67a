variable "name" {
  description = "Deployment name."
  type        = string
}

variable "vpc_id" {
  description = "The VPC."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets the load balancer listens in (one per zone)."
  type        = list(string)
}

variable "domain_name" {
  description = "Public name of the API, e.g. api.example.com; the ACM certificate is issued for it."
  type        = string
}

variable "route53_zone_id" {
  description = "Hosted zone of domain_name: holds the certificate's validation records and the alias to the ALB."
  type        = string
}

variable "target_port" {
  description = "Port the edge containers listen on."
  type        = number
  default     = 8000
}

variable "idle_timeout_s" {
  description = "Seconds a connection may stay silent. Streams wait for their first token with keep-alives every few seconds, but a generation can run for minutes: keep this long."
  type        = number
  default     = 3600
}

variable "deregistration_delay_s" {
  description = "How long the ALB keeps a deregistering edge task's open streams before it closes them; ECS sends the task SIGTERM only after this. Equal to the edge's [server] drain_deadline_s, so a stream gets the same time whichever way its task stops (docs/deploy.md, graceful drain)."
  type        = number
  default     = 90
}

variable "public_paths" {
  description = "ALB path patterns forwarded to the edge: the public API, the playground and the liveness check. Operator endpoints (/metrics, /v1/internal/*, /v1/admin/*) are left out on purpose."
  type        = list(string)
  default = [
    "/v1/chat/completions",
    "/v1/chat/completions/*",
    "/v1/models",
    "/v1/models/*",
    "/v1/conversations/*",
    "/v1/usage",
    "/",
    "/healthz",
  ]
}

variable "log_bucket" {
  description = "Bucket receiving the access logs."
  type        = string
}

variable "log_prefix" {
  description = "Key prefix of the access logs."
  type        = string
  default     = "alb"
}

variable "waf_rate_limit_per_5min" {
  description = "Requests one client IP may send in five minutes before WAF blocks it (the edge's per-user limits sit behind this)."
  type        = number
  default     = 20000
}

variable "kms_key_arn" {
  description = "Key that encrypts the WAF log group."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the WAF logs."
  type        = number
  default     = 365
}

variable "deletion_protection" {
  description = "Refuse to delete the load balancer (turn off to destroy the environment)."
  type        = bool
  default     = true
}

variable "waf_count_only_body_rules" {
  description = "Rules of AWSManagedRulesCommonRuleSet that inspect the body and would block prompts with code or URLs: counted, not blocked."
  type        = list(string)
  default = [
    "SizeRestrictions_BODY",
    "CrossSiteScripting_BODY",
    "GenericLFI_BODY",
    "GenericRFI_BODY",
    "EC2MetaDataSSRF_BODY",
  ]
}

variable "waf_count_only_known_bad_input_body_rules" {
  description = "Rules of AWSManagedRulesKnownBadInputsRuleSet that inspect the body and would block prompts quoting Log4Shell strings or serialized Java (security questions, pasted data): counted, not blocked. Its header, URI and query rules still block."
  type        = list(string)
  default = [
    "Log4JRCE_BODY",
    "JavaDeserializationRCE_BODY",
  ]
}
