output "url" {
  description = "Repository URL (docker push target)."
  value       = aws_ecr_repository.this.repository_url
}

output "arn" {
  description = "Repository ARN."
  value       = aws_ecr_repository.this.arn
}
