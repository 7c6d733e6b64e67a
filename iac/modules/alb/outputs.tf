output "security_group_id" {
  description = "The load balancer's security group (the edge admits traffic from it only)."
  value       = aws_security_group.alb.id
}

output "target_group_arn" {
  description = "Target group the edge service registers its tasks in; known only once the HTTPS listener forwards to it (ECS refuses a target group without a load balancer)."
  value       = aws_lb_target_group.edge.arn
  depends_on  = [aws_lb_listener.https, aws_lb_listener_rule.public]
}

output "arn_suffix" {
  description = "Load balancer dimension of its CloudWatch metrics."
  value       = aws_lb.this.arn_suffix
}

output "target_group_arn_suffix" {
  description = "Target group dimension of its CloudWatch metrics."
  value       = aws_lb_target_group.edge.arn_suffix
}

output "dns_name" {
  description = "DNS name of the load balancer."
  value       = aws_lb.this.dns_name
}

output "https_listener_arn" {
  description = "The HTTPS listener (the edge service depends on it existing)."
  value       = aws_lb_listener.https.arn
}

output "idle_timeout_s" {
  description = "Seconds the load balancer keeps a silent connection; the edge's HTTP keep-alive must outlast it, or the ALB reuses a connection the edge is closing and answers 502."
  value       = aws_lb.this.idle_timeout
}
