output "name" {
  description = "Table name (messages.dynamodb_table in the edge's settings)."
  value       = aws_dynamodb_table.messages.name
}

output "arn" {
  description = "Table ARN (the edge task role's only table)."
  value       = aws_dynamodb_table.messages.arn
}
