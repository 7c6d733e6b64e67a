variable "name" {
  description = "Bucket name (globally unique)."
  type        = string
}

variable "retention_days" {
  description = "Days a log object is kept."
  type        = number
  default     = 365
}
