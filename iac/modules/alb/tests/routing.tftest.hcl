# What the load balancer lets through, planned against a mocked AWS provider (no account needed):
# the public API reaches the edge, the operator endpoints do not; the health check is liveness; a
# deregistering task is cut no later than the edge's drain allows.

mock_provider "aws" {
  # Planned values come from the mocks: the certificate's validation records key a for_each.
  override_during = plan

  mock_data "aws_vpc" {
    defaults = { cidr_block = "10.0.0.0/16" }
  }

  mock_resource "aws_acm_certificate" {
    defaults = {
      arn = "arn:aws:acm:us-east-1:111122223333:certificate/abc"
      domain_validation_options = [{
        domain_name           = "api.example.com"
        resource_record_name  = "_x.api.example.com"
        resource_record_type  = "CNAME"
        resource_record_value = "_y.acm-validations.aws"
      }]
    }
  }
}

variables {
  name              = "fg"
  vpc_id            = "vpc-123"
  public_subnet_ids = ["subnet-a", "subnet-b"]
  domain_name       = "api.example.com"
  route53_zone_id   = "Z123"
  log_bucket        = "fg-logs"
  kms_key_arn       = "arn:aws:kms:us-east-1:111122223333:key/abc"

  # Paths the edge serves, and whether the public may reach them.
  public = [
    "/v1/chat/completions",
    "/v1/chat/completions/chatcmpl-123/cancel",
    "/v1/models",
    "/v1/models/llama-3-8b",
    "/v1/conversations/c-1/messages",
    "/v1/usage",
    "/",
    "/healthz",
  ]
  operator = [
    "/metrics",
    "/v1/internal/engine",
    "/v1/admin/keys",
    "/v1/admin/keys/k-1/revoke",
    "/readyz",
  ]
}

# One run: each run loads the AWS provider again (about 15 s).
run "routing_health_check_drain_and_waf" {
  command = plan

  assert {
    condition = alltrue([
      for path in var.public : anytrue([
        for rule in aws_lb_listener_rule.public : anytrue([
          for pattern in one(rule.condition).path_pattern[0].values :
          can(regex("^${replace(replace(pattern, "?", "."), "*", ".*")}$", path))
        ])
      ])
    ])
    error_message = "a public API path is not forwarded to the edge"
  }

  assert {
    condition = !anytrue([
      for path in var.operator : anytrue([
        for rule in aws_lb_listener_rule.public : anytrue([
          for pattern in one(rule.condition).path_pattern[0].values :
          can(regex("^${replace(replace(pattern, "?", "."), "*", ".*")}$", path))
        ])
      ])
    ])
    error_message = "an operator endpoint (/metrics, /v1/internal/*, /v1/admin/*) is reachable through the load balancer"
  }

  assert {
    condition     = alltrue([for rule in aws_lb_listener_rule.public : one(rule.action).type == "forward"])
    error_message = "public rules must forward to the edge"
  }

  assert {
    condition     = one(aws_lb_listener.https.default_action).type == "fixed-response"
    error_message = "a path no rule names must not reach the edge"
  }

  assert {
    condition     = one(one(aws_lb_listener.https.default_action).fixed_response).status_code == "404"
    error_message = "unknown paths answer 404"
  }

  assert {
    condition     = one(aws_lb_target_group.edge.health_check).path == "/healthz"
    error_message = "/readyz is 503 while no GPU replica is ready: ECS would kill every edge task during GPU bring-up"
  }

  assert {
    # ECS waits the deregistration delay (the ALB then closes what is left), then sends SIGTERM and
    # waits stopTimeout (at most 120 s on Fargate): the delay is the streams' drain window, equal to
    # the edge's [server] drain_deadline_s (tests/iac/test_structure.py reads edge/defaults.toml).
    condition     = aws_lb_target_group.edge.deregistration_delay == "90"
    error_message = "deregistration delay must equal the edge's drain_deadline_s, 90 s (docs/deploy.md, graceful drain)"
  }

  assert {
    # The example environment sets the edge's HTTP keep-alive above this output (edge.toml.tftpl).
    condition     = output.idle_timeout_s == aws_lb.this.idle_timeout && output.idle_timeout_s == 3600
    error_message = "idle_timeout_s must report the load balancer's own idle timeout"
  }

  assert {
    condition = length(setsubtract(
      ["CrossSiteScripting_BODY", "GenericLFI_BODY", "GenericRFI_BODY", "EC2MetaDataSSRF_BODY", "SizeRestrictions_BODY"],
      [for o in one(one([for r in aws_wafv2_web_acl.this.rule : r if r.name == "common"]).statement).managed_rule_group_statement[0].rule_action_override : o.name if length(one(o.action_to_use).count) == 1]
    )) == 0
    error_message = "a body rule of the common rule set still blocks prompts that contain code or URLs"
  }

  # A flooding client is answered as the edge answers a limit: 429, Retry-After, an OpenAI error
  # object (clients retry that; WAF's bare 403 reads as a bad key and is never retried).
  assert {
    condition = alltrue([
      for block in one([for r in aws_wafv2_web_acl.this.rule : r if r.name == "per-ip-flood"]).action[0].block : alltrue([
        one(block.custom_response).response_code == 429,
        tonumber(one([for h in one(block.custom_response).response_header : h.value if lower(h.name) == "retry-after"])) > 0,
        jsondecode(one([
          for b in aws_wafv2_web_acl.this.custom_response_body : b.content
          if b.key == one(block.custom_response).custom_response_body_key && b.content_type == "APPLICATION_JSON"
        ])).error.type == "rate_limit_exceeded",
      ])
    ])
    error_message = "the per-IP flood block must answer 429 with Retry-After and an OpenAI error object"
  }
}

# The known-bad-inputs group inspects the body too: a prompt quoting a Log4Shell string ("${jndi:")
# or a serialized Java object (rO0AB…), as people ask about security or paste a Java stack's data,
# was answered the WAF's HTML 403, not by the edge (which runs no Java, so neither string can hurt
# it). Its body rules only count, as the common set's do; its header, URI and query rules block.
run "known_bad_inputs_body_rules_only_count" {
  command = plan

  assert {
    condition = length(setsubtract(
      ["Log4JRCE_BODY", "JavaDeserializationRCE_BODY"],
      [for o in one(one([for r in aws_wafv2_web_acl.this.rule : r if r.name == "known-bad-inputs"]).statement).managed_rule_group_statement[0].rule_action_override : o.name if length(one(o.action_to_use).count) == 1]
    )) == 0
    error_message = "a body rule of the known-bad-inputs rule set still blocks prompts that quote Log4Shell or Java serialization strings"
  }

  assert {
    condition = length([
      for o in one(one([for r in aws_wafv2_web_acl.this.rule : r if r.name == "known-bad-inputs"]).statement).managed_rule_group_statement[0].rule_action_override : o
      if !endswith(o.name, "_BODY")
    ]) == 0
    error_message = "only the known-bad-inputs body rules may be relaxed: its header, URI and query rules still block"
  }
}
