variable "name" {
  description = "Deployment name; the key's alias is alias/<name>."
  type        = string
}

variable "create_autoscaling_service_linked_role" {
  description = "Create the account's Auto Scaling service-linked role (AWSServiceRoleForAutoScaling), which the key policy names. Set false where the account already has it."
  type        = bool
  default     = true
}
