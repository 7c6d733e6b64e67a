output "bucket" {
  description = "Name of the log bucket, known only once its policy lets the ALB and S3 write (the ALB refuses a bucket it may not write to)."
  value       = aws_s3_bucket.this.id
  depends_on  = [aws_s3_bucket_policy.this]
}

output "alb_prefix" {
  description = "Key prefix the ALB writes its access logs under."
  value       = "alb"
}

output "s3_prefix" {
  description = "Key prefix for S3 server access logs (add the source bucket's name)."
  value       = "s3/"
}
