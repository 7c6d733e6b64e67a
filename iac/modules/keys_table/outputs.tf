output "name" {
  description = "Table name (keys.dynamodb_table in the edge's settings)."
  value       = aws_dynamodb_table.keys.name
}

output "arn" {
  description = "Table ARN."
  value       = aws_dynamodb_table.keys.arn
}
