variable "name" {
  description = "Bucket name (globally unique)."
  type        = string
}

variable "kms_key_arn" {
  description = "Key encrypting the engines."
  type        = string
}

variable "log_bucket" {
  description = "Bucket receiving this bucket's server access logs."
  type        = string
}

variable "log_prefix" {
  description = "Key prefix of the access logs."
  type        = string
}

variable "noncurrent_version_days" {
  description = "Days a replaced engine version is kept for rollback."
  type        = number
  default     = 30
}
