variable "name" {
  description = "Repository name."
  type        = string
}

variable "kms_key_arn" {
  description = "Key encrypting the images."
  type        = string
}

variable "keep_images" {
  description = "Most recent images kept; older ones expire."
  type        = number
  default     = 30
}
