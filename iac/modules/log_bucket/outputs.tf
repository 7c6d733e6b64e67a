output "bucket" {
  description = "Name of the log bucket."
  value       = aws_s3_bucket.this.id
}

output "alb_prefix" {
  description = "Key prefix the ALB writes its access logs under."
  value       = "alb"
}

output "s3_prefix" {
  description = "Key prefix for S3 server access logs (add the source bucket's name)."
  value       = "s3/"
}
