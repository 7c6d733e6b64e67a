output "bucket" {
  description = "Name of the engine bucket."
  value       = aws_s3_bucket.engines.id
}

output "arn" {
  description = "ARN of the engine bucket."
  value       = aws_s3_bucket.engines.arn
}
