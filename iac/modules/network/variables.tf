variable "name" {
  description = "Deployment name, prefixed to every resource."
  type        = string
}

variable "cidr_block" {
  description = "The VPC's address range."
  type        = string
  default     = "10.40.0.0/16"
}

variable "availability_zones" {
  description = "Zones to span, named explicitly: GPU instance types are not offered in every zone, and a zone AWS adds later must not silently change the subnets. Redis multi-AZ and the ALB need at least 2."
  type        = list(string)

  # Distinct ones: a zone named twice is one zone, one subnet of each kind.
  validation {
    condition     = length(distinct(var.availability_zones)) >= 2
    error_message = "Give at least two different availability zones."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all zones instead of one per zone: cheaper, loses egress if its zone fails."
  type        = bool
  default     = false
}

variable "kms_key_arn" {
  description = "Key that encrypts the flow-log group."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the VPC flow logs."
  type        = number
  default     = 365
}

variable "interface_endpoints" {
  description = "AWS services reached through interface endpoints instead of the NAT (image pulls, logs, metrics, secrets)."
  type        = list(string)
  default     = ["ecr.api", "ecr.dkr", "logs", "monitoring", "secretsmanager", "sts", "autoscaling"]
}
