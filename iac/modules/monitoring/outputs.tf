output "alarm_topic_arn" {
  description = "SNS topic of the alarms."
  value       = aws_sns_topic.alarms.arn
}

output "dashboard_name" {
  description = "The CloudWatch dashboard."
  value       = aws_cloudwatch_dashboard.this.dashboard_name
}
