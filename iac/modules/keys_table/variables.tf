variable "name" {
  description = "Table name (keys.dynamodb_table in the edge's settings)."
  type        = string
}

variable "kms_key_arn" {
  description = "Key encrypting the table."
  type        = string
}

variable "edge_task_role_arn" {
  description = "The edge tasks' role: it gets the table's calls the edge makes (and nothing else on it)."
  type        = string
}
