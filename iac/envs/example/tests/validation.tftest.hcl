# What the example environment refuses when it plans (mocked AWS provider, tests/mocks): settings
# the edge would refuse at start (every task crash-looping) and names AWS cannot take.

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

run "a_tier_the_edge_does_not_define" {
  command = plan

  variables {
    tier_models = { enterprise = ["llama-3-8b"] }
  }

  expect_failures = [var.tier_models]
}

run "a_tier_naming_a_model_not_served" {
  command = plan

  variables {
    tier_models = { free = ["llama-3-70b"] }
  }

  expect_failures = [output.tier_models]
}

run "a_model_name_with_a_slash" {
  command = plan

  variables {
    models = {
      "meta/llama-3-8b" = {
        instance_type = "g6e.xlarge", engine_prefix = "engines/llama-3-8b/l40s/", min_size = 1,
        max_size      = 8, warm_pool_min_size = 2, demand_target = 0.8
      }
    }
  }

  expect_failures = [var.models]
}

run "an_engine_prefix_with_a_leading_slash" {
  command = plan

  variables {
    models = {
      "llama-3-8b" = {
        instance_type = "g6e.xlarge", engine_prefix = "/engines/llama-3-8b/l40s/", min_size = 1,
        max_size      = 8, warm_pool_min_size = 2, demand_target = 0.8
      }
    }
  }

  expect_failures = [var.models]
}

run "a_model_named_dot_dot" {
  command = plan

  variables {
    models = {
      ".." = {
        instance_type = "g6e.xlarge", engine_prefix = "engines/llama-3-8b/l40s/", min_size = 1,
        max_size      = 8, warm_pool_min_size = 2, demand_target = 0.8
      }
    }
  }

  expect_failures = [var.models]
}

run "a_model_name_cloudwatch_refuses_as_a_dimension" {
  command = plan

  variables {
    models = {
      "modèle-8b" = {
        instance_type = "g6e.xlarge", engine_prefix = "engines/llama-3-8b/l40s/", min_size = 1,
        max_size      = 8, warm_pool_min_size = 2, demand_target = 0.8
      }
    }
  }

  expect_failures = [var.models]
}

run "two_model_names_one_gpu_group" {
  command = plan

  variables {
    models = {
      "llama-3.1-8b" = {
        instance_type      = "g6e.xlarge", engine_prefix = "engines/a/", min_size = 1, max_size = 8,
        warm_pool_min_size = 2, demand_target = 0.8, edge_model_dir = "/opt/floodgate/a"
      }
      "llama-3-1-8b" = {
        instance_type      = "g6e.xlarge", engine_prefix = "engines/b/", min_size = 1, max_size = 8,
        warm_pool_min_size = 2, demand_target = 0.8, edge_model_dir = "/opt/floodgate/b"
      }
    }
  }

  expect_failures = [var.models]
}

# The edge refuses a decode price of 0 (a request would cost nothing: its group never scales).
run "a_model_price_the_edge_refuses" {
  command = plan

  variables {
    models = {
      "llama-3-8b" = {
        instance_type      = "g6e.xlarge", engine_prefix = "engines/llama-3-8b/l40s/", min_size = 1,
        max_size           = 8, warm_pool_min_size = 2, demand_target = 0.8, prefill_s_per_token = 0.00002,
        decode_s_per_token = 0
      }
    }
  }

  expect_failures = [var.models]
}

# A deregistration delay the edge could not drain in before the task's stopTimeout (120 s) kills it.
run "a_drain_longer_than_the_task_may_stop" {
  command = plan

  variables {
    deregistration_delay_s = 120
  }

  expect_failures = [var.deregistration_delay_s]
}

# The edge refuses [limiter] instance_count = 0, which the settings take from edge_min_count: every
# task would crash-loop on its settings (and target tracking on CPU never starts a first task).
run "no_edge_task" {
  command = plan

  variables {
    edge_min_count = 0
  }

  expect_failures = [var.edge_min_count]
}

# With no [models.*] the edge serves its built-in defaults (edge/defaults.toml): the random-weight
# demo model and SmolLM2 on CPU engines inside the task (the demo model answers noise), and no GPU
# group exists.
run "no_model" {
  command = plan

  variables {
    models = {}
  }

  expect_failures = [var.models]
}

# The name prefixes the buckets ("<name>-logs-…", "<name>-engines-…") and the ECR repositories
# ("<name>/edge"), which take lowercase letters, digits and single hyphens only. A name such as
# "Floodgate-Prod" planned clean and failed at apply on CreateBucket and CreateRepository, with the
# VPC, the key, the tables and Redis already made: renaming then replaced all of them.
run "a_name_with_capitals" {
  command = plan

  variables {
    name = "Floodgate-Prod"
  }

  expect_failures = [var.name]
}

run "a_name_with_a_double_hyphen" {
  command = plan

  variables {
    name = "floodgate--prod"
  }

  expect_failures = [var.name]
}

# S3 reserves the bucket name prefixes "sthree-" and "amzn-s3-demo-" (and "xn--", which a name of
# single hyphens cannot make): "sthree" planned clean and CreateBucket refused "sthree-logs-…" at
# apply, the VPC, the key and the tables already made.
run "a_name_s3_reserves_as_a_bucket_prefix" {
  command = plan

  variables {
    name = "sthree"
  }

  expect_failures = [var.name]
}

run "a_name_s3_reserves_for_its_examples" {
  command = plan

  variables {
    name = "amzn-s3-demo"
  }

  expect_failures = [var.name]
}

# The edge refuses a model's token_weight of 0 or less ([models.*] token_weight > 0; 0 looks like
# "its tokens count for nothing") and a max_model_len that is not a whole number of at least 1
# (8192.5 renders as a TOML float): every task crash-looped on its settings, the plan clean.
run "a_token_weight_the_edge_refuses" {
  command = plan

  variables {
    models = {
      "llama-3-8b" = {
        instance_type = "g6e.xlarge", engine_prefix = "engines/llama-3-8b/l40s/", min_size = 1,
        max_size      = 8, warm_pool_min_size = 2, demand_target = 0.8, token_weight = 0
      }
    }
  }

  expect_failures = [var.models]
}

run "a_context_the_edge_refuses" {
  command = plan

  variables {
    models = {
      "llama-3-8b" = {
        instance_type = "g6e.xlarge", engine_prefix = "engines/llama-3-8b/l40s/", min_size = 1,
        max_size      = 8, warm_pool_min_size = 2, demand_target = 0.8, max_model_len = 8192.5
      }
    }
  }

  expect_failures = [var.models]
}

# The edge refuses a negative [fleet] members_per_replica, and a fraction renders as a TOML float
# it refuses too: every task would crash-loop on its settings.
run "a_negative_members_per_replica" {
  command = plan

  variables {
    members_per_replica = -1
  }

  expect_failures = [var.members_per_replica]
}

run "a_fractional_members_per_replica" {
  command = plan

  variables {
    members_per_replica = 2.5
  }

  expect_failures = [var.members_per_replica]
}
