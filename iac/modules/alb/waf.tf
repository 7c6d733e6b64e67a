# Web ACL on the load balancer: AWS managed rules plus a per-IP flood guard. A chat body is user
# text: people paste code, shell commands, file paths, URLs and HTML into prompts. The common rule
# set's body rules (cross-site scripting, local and remote file inclusion, metadata-service URLs,
# the 8 KB size rule) would answer those 403, so they only count; so do the known-bad-inputs
# group's body rules (Log4Shell strings, serialized Java: asked about, pasted, and harmless to an
# edge that runs no Java). The rules on the URI, query and headers still block. The edge validates
# and bounds every body itself.

resource "aws_wafv2_web_acl" "this" {
  name  = var.name
  scope = "REGIONAL"

  default_action {
    allow {}
  }

  rule {
    name     = "common"
    priority = 10
    override_action {
      none {}
    }
    statement {
      managed_rule_group_statement {
        vendor_name = "AWS"
        name        = "AWSManagedRulesCommonRuleSet"
        dynamic "rule_action_override" {
          for_each = var.waf_count_only_body_rules
          content {
            name = rule_action_override.value
            action_to_use {
              count {}
            }
          }
        }
      }
    }
    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${var.name}-common"
      sampled_requests_enabled   = true
    }
  }

  rule {
    name     = "known-bad-inputs"
    priority = 20
    override_action {
      none {}
    }
    statement {
      managed_rule_group_statement {
        vendor_name = "AWS"
        name        = "AWSManagedRulesKnownBadInputsRuleSet"
        dynamic "rule_action_override" {
          for_each = var.waf_count_only_known_bad_input_body_rules
          content {
            name = rule_action_override.value
            action_to_use {
              count {}
            }
          }
        }
      }
    }
    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${var.name}-known-bad-inputs"
      sampled_requests_enabled   = true
    }
  }

  # Over the flood limit a client gets what the edge answers over a limit: a 429 with Retry-After
  # and an OpenAI error object. WAF's own block is a bare 403, which our client and the OpenAI SDK
  # read as a bad key (PermissionDenied/Authentication) and never retry, and which a person reads as
  # "your key is wrong".
  rule {
    name     = "per-ip-flood"
    priority = 30
    action {
      block {
        custom_response {
          response_code            = 429
          custom_response_body_key = "per-ip-flood"
          response_header {
            name  = "Retry-After"
            value = tostring(local.flood_retry_after_s)
          }
        }
      }
    }
    statement {
      rate_based_statement {
        limit                 = var.waf_rate_limit_per_5min
        aggregate_key_type    = "IP"
        evaluation_window_sec = 300
      }
    }
    visibility_config {
      cloudwatch_metrics_enabled = true
      metric_name                = "${var.name}-per-ip-flood"
      sampled_requests_enabled   = true
    }
  }

  custom_response_body {
    key          = "per-ip-flood"
    content_type = "APPLICATION_JSON"
    content = jsonencode({
      error = {
        message = "Too many requests from this address: at most ${var.waf_rate_limit_per_5min} in 5 minutes. Retry after ${local.flood_retry_after_s} s."
        type    = "rate_limit_exceeded"
        code    = "ip_requests"
        param   = null
      }
    })
  }

  visibility_config {
    cloudwatch_metrics_enabled = true
    metric_name                = var.name
    sampled_requests_enabled   = true
  }
}

locals {
  # WAF blocks an address while its count over the last 5 minutes (its blocked requests included)
  # stays past the limit. A retry every minute adds next to nothing to that count while the flood's
  # oldest minute ages out; the OpenAI SDK honours a Retry-After of up to 60 s, and past that falls
  # back to its own backoff of a few seconds, which would keep the count up.
  flood_retry_after_s = 60
}

resource "aws_wafv2_web_acl_association" "this" {
  resource_arn = aws_lb.this.arn
  web_acl_arn  = aws_wafv2_web_acl.this.arn
}

# WAF only logs to groups whose name starts with aws-waf-logs-.
resource "aws_cloudwatch_log_group" "waf" {
  name              = "aws-waf-logs-${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

resource "aws_wafv2_web_acl_logging_configuration" "this" {
  resource_arn            = aws_wafv2_web_acl.this.arn
  log_destination_configs = [aws_cloudwatch_log_group.waf.arn]

  redacted_fields {
    single_header {
      name = "authorization"
    }
  }
}
