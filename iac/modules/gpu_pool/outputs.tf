output "autoscaling_group_name" {
  description = "The model's GPU Auto Scaling group."
  value       = aws_autoscaling_group.gpu.name
}

output "autoscaling_group_arn" {
  description = "ARN of the model's GPU Auto Scaling group."
  value       = aws_autoscaling_group.gpu.arn
}

output "security_group_id" {
  description = "Security group of the GPU hosts."
  value       = aws_security_group.gpu.id
}

output "host_role_arn" {
  description = "Role the GPU hosts run as."
  value       = aws_iam_role.gpu.arn
}
