# The knobs docs/deploy.md tells operators to change, each set from the example environment (mocked
# AWS provider, no account). A test file's assertions see only the environment's own values, not
# the modules' resources: tests/iac/test_example_plan.py reads this plan (`terraform test -json
# -verbose`) and finds each value on the resource it configures; settings.tftest.hcl's plan, with
# none of them set, on the modules' defaults.

mock_provider "aws" {
  override_during = plan
  source          = "./tests/mocks"
}

variables {
  domain_name      = "api.example.com"
  route53_zone_id  = "Z0123"
  edge_image_tag   = "1"
  triton_image_tag = "1"
}

run "every_documented_knob" {
  command = plan

  variables {
    models = {
      "llama-3-8b" = {
        instance_type      = "g6e.xlarge"
        engine_prefix      = "engines/llama-3-8b/l40s/"
        min_size           = 1
        max_size           = 8
        warm_pool_min_size = 2
        demand_target      = 0.8
        # Longer streams, a slower engine download, a later surge.
        scale_in_drain_s          = 900
        wait_for_capacity_timeout = "45m"
        surge_demand              = 2
      }
    }
    interface_endpoints     = ["ecr.api", "ecr.dkr", "logs"]
    deregistration_delay_s  = 110
    noncurrent_version_days = 7
    log_retention_days      = 30
    # Not the K derived from edge_max_count and max_size (50 here).
    members_per_replica = 12
  }

  assert {
    condition     = output.edge_members_per_replica == 12
    error_message = "var.members_per_replica is the edge's K as given, not the derived one"
  }
}
