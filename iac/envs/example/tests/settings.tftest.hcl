# The example environment planned against a mocked AWS provider (tests/mocks, no account), with
# models named the way Llama 3.1 and Qwen2.5 are, with a dot. tests/iac/test_example_plan.py reads
# this plan (`terraform test -json -verbose`) and loads the edge settings it renders with the edge's
# own start script and loader, and checks every AWS name against the API's own pattern.

mock_provider "aws" {
  override_during = plan
  source          = "./tests/mocks"
}

variables {
  domain_name      = "api.example.com"
  route53_zone_id  = "Z0123"
  edge_image_tag   = "1"
  triton_image_tag = "1"
  models = {
    "llama-3.1-8b" = {
      instance_type      = "g6e.xlarge"
      engine_prefix      = "engines/llama-3.1-8b/l40s/"
      min_size           = 1
      max_size           = 8
      warm_pool_min_size = 2
      demand_target      = 0.8
      edge_model_dir     = "/opt/floodgate/model/llama-3.1-8b"
      # Its replicas' own prices in its scaling demand (the 72B keeps the edge's defaults).
      prefill_s_per_token = 0.00002
      decode_s_per_token  = 0.00005
    }
    "qwen2.5-72b" = {
      instance_type      = "p5.48xlarge"
      engine_prefix      = "engines/qwen2.5-72b/h100x8/"
      min_size           = 1
      max_size           = 4
      warm_pool_min_size = 1
      demand_target      = 0.8
      edge_model_dir     = "/opt/floodgate/model/qwen2.5-72b"
      token_weight       = 4
      root_volume_gb     = 400
      # Its engine built for a longer context than build_engine.py's default 8192.
      max_model_len = 32768
    }
  }
  # Every tier the edge defines (edge/defaults.toml).
  tier_models = { free = ["llama-3.1-8b"], paid = ["qwen2.5-72b", "llama-3.1-8b"] }
}

run "dotted_model_names" {
  command = plan

  # AWS names allow no dot in a lifecycle hook's name: the group (which names the hooks) uses the
  # model's name with the dot made a dash.
  assert {
    condition = output.gpu_autoscaling_groups == {
      "llama-3.1-8b" = "floodgate-gpu-llama-3-1-8b"
      "qwen2.5-72b"  = "floodgate-gpu-qwen2-5-72b"
    }
    error_message = "each model's GPU group is named from its name made safe for AWS (no dot)"
  }

  assert {
    condition     = output.tier_models == var.tier_models
    error_message = "the tiers keep the models' real names"
  }

  # Not derived from the fleet's sizes (a K sized for max_size leaves processes among no replica
  # once the groups scale in): every process divides every replica unless the operator says.
  assert {
    condition     = output.edge_members_per_replica == 0
    error_message = "members_per_replica unset is 0, every process dividing every replica"
  }
}

# Operators' Prometheus (its own security group) scrapes /metrics on the tasks' operator port.
run "a_metrics_scraper" {
  command = plan

  variables {
    metrics_scraper_security_group_ids = ["sg-0prometheus"]
  }

  assert {
    condition     = output.edge_ops_port == 9464
    error_message = "the operator listener's port is the edge module's"
  }
}

# What an operator needs after apply besides the API's URL: the alarm topic (to subscribe a pager;
# alarm_emails reach only e-mail) and the edge's cluster and service (to restart the tasks after
# changing the api-keys secret, which they read at start).
run "operator_outputs" {
  command = plan

  assert {
    condition     = output.alarm_topic_arn == "arn:aws:sns:us-east-1:111122223333:floodgate-alarms"
    error_message = "the alarm topic is an output"
  }

  assert {
    condition     = output.edge_cluster_name == "floodgate" && output.edge_service_name == "edge"
    error_message = "the edge's ECS cluster and service are outputs"
  }
}
