variable "name" {
  description = "Deployment name; the key's alias is alias/<name>."
  type        = string
}
