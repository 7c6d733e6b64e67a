variable "name" {
  description = "Table name."
  type        = string
}

variable "kms_key_arn" {
  description = "Key encrypting the table."
  type        = string
}
