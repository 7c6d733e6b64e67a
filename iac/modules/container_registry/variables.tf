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

variable "protected_tags" {
  description = "Tags in use (the deployed images): never expired, however many images are pushed after them."
  type        = list(string)
  default     = []

  # A tag is matched as a pattern, where '*' is a wildcard: Docker tags have none.
  validation {
    condition     = alltrue([for tag in var.protected_tags : can(regex("^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", tag))])
    error_message = "protected_tags must be Docker tags: letters, digits, '_', '.' and '-', at most 128 characters, not starting with '.' or '-'."
  }
}
