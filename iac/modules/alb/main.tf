# HTTPS in front of the edge. Streams are long-lived: the idle timeout is raised far above the 60 s
# default, the target group balances on outstanding requests (not round robin, which ignores that a
# stream occupies an edge for minutes), and a draining task keeps its streams for a while.

resource "aws_security_group" "alb" {
  name        = "${var.name}-alb"
  description = "Public HTTPS to the load balancer"
  vpc_id      = var.vpc_id

  ingress {
    description = "HTTPS from anywhere"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  #checkov:skip=CKV_AWS_260:port 80 only answers a redirect to HTTPS
  ingress {
    description = "HTTP from anywhere, redirected to HTTPS"
    from_port   = 80
    to_port     = 80
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  egress {
    description = "To the edge tasks"
    from_port   = var.target_port
    to_port     = var.target_port
    protocol    = "tcp"
    cidr_blocks = [data.aws_vpc.this.cidr_block]
  }
}

data "aws_vpc" "this" {
  id = var.vpc_id
}

resource "aws_lb" "this" {
  #checkov:skip=CKV2_AWS_76:the attached ACL has the Log4j rules (KnownBadInputs); AnonymousIpList is left out on purpose, it blocks API clients on VPNs and cloud hosts
  name                       = var.name
  load_balancer_type         = "application"
  internal                   = false
  subnets                    = var.public_subnet_ids
  security_groups            = [aws_security_group.alb.id]
  idle_timeout               = var.idle_timeout_s
  drop_invalid_header_fields = true
  enable_deletion_protection = var.deletion_protection

  access_logs {
    bucket  = var.log_bucket
    prefix  = var.log_prefix
    enabled = true
  }
}

resource "aws_lb_target_group" "edge" {
  #checkov:skip=CKV_AWS_378:TLS ends at the load balancer; the targets are tasks in private subnets that admit only the ALB's security group
  name                          = "${var.name}-edge"
  port                          = var.target_port
  protocol                      = "HTTP"
  target_type                   = "ip"
  vpc_id                        = var.vpc_id
  deregistration_delay          = var.deregistration_delay_s
  load_balancing_algorithm_type = "least_outstanding_requests"

  # Liveness, not readiness: /readyz is 503 while no GPU replica is ready (GPU bring-up, scale from
  # zero), and failing it would make ECS replace every edge task exactly then. The edge's own
  # admission answers requests without a replica (503/429 with Retry-After).
  health_check {
    path                = "/healthz"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }
}

resource "aws_acm_certificate" "this" {
  domain_name       = var.domain_name
  validation_method = "DNS"

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_route53_record" "validation" {
  for_each = {
    for o in aws_acm_certificate.this.domain_validation_options : o.domain_name => o
  }
  zone_id         = var.route53_zone_id
  name            = each.value.resource_record_name
  type            = each.value.resource_record_type
  records         = [each.value.resource_record_value]
  ttl             = 300
  allow_overwrite = true
}

resource "aws_acm_certificate_validation" "this" {
  certificate_arn         = aws_acm_certificate.this.arn
  validation_record_fqdns = [for r in aws_route53_record.validation : r.fqdn]
}

# Only the public API reaches the edge. Everything else (the operator endpoints /metrics,
# /v1/internal/*, /v1/admin/*, and any path not listed) gets a 404 from the load balancer itself.
# Operators reach /metrics and /v1/internal/engine from inside the VPC, on the tasks' operator port,
# from the security groups the example's metrics_scraper_security_group_ids names (edge_service).
resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = aws_acm_certificate_validation.this.certificate_arn

  default_action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/json"
      status_code  = "404"
      message_body = jsonencode({ error = { message = "Not found.", type = "invalid_request_error", code = "not_found" } })
    }
  }
}

# An ALB rule takes at most five path patterns: one rule per five public paths.
resource "aws_lb_listener_rule" "public" {
  for_each     = { for i, paths in chunklist(var.public_paths, 5) : tostring(i) => paths }
  listener_arn = aws_lb_listener.https.arn
  priority     = 10 + tonumber(each.key)

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.edge.arn
  }

  condition {
    path_pattern {
      values = each.value
    }
  }
}

resource "aws_lb_listener" "http_redirect" {
  #checkov:skip=CKV_AWS_2:this listener only redirects to HTTPS
  #checkov:skip=CKV_AWS_103:this listener only redirects to HTTPS; TLS is set on the HTTPS listener
  load_balancer_arn = aws_lb.this.arn
  port              = 80
  protocol          = "HTTP"

  default_action {
    type = "redirect"
    redirect {
      port        = "443"
      protocol    = "HTTPS"
      status_code = "HTTP_301"
    }
  }
}

resource "aws_route53_record" "api" {
  zone_id = var.route53_zone_id
  name    = var.domain_name
  type    = "A"

  alias {
    name                   = aws_lb.this.dns_name
    zone_id                = aws_lb.this.zone_id
    evaluate_target_health = true
  }
}
