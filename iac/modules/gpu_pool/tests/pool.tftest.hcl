# The GPU pool planned against a mocked AWS provider (no account needed). The dependency order of
# its resources is checked on Terraform's own graph (tests/iac/test_dependency_order.py).

mock_provider "aws" {
  override_during = plan

  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
  mock_data "aws_caller_identity" {
    defaults = { account_id = "111122223333" }
  }
  # Policy documents are built by the provider itself: a mock must still be JSON.
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  mock_data "aws_ssm_parameter" {
    defaults = { insecure_value = "ami-0latest00000000" }
  }
}

variables {
  group_name                = "fg-gpu-llama"
  model                     = "llama"
  vpc_id                    = "vpc-1"
  private_subnet_ids        = ["subnet-a"]
  edge_security_group_id    = "sg-edge"
  triton_image              = "111122223333.dkr.ecr.us-east-1.amazonaws.com/fg/triton:1"
  ecr_repository_arn        = "arn:aws:ecr:us-east-1:111122223333:repository/fg/triton"
  engine_bucket_arn         = "arn:aws:s3:::fg-engines"
  engine_s3_uri             = "s3://fg-engines/engines/llama/l40s/"
  kms_key_arn               = "arn:aws:kms:us-east-1:111122223333:key/abc"
  metric_namespace          = "Floodgate"
  demand_metric             = "DemandPerReplica"
  replica_load_metric       = "ReplicaLoadPerReplica"
  metric_model_dimension    = "Model"
  metric_period_s           = 60
  metric_samples_per_period = 6
}

run "latest_ami_is_an_explicit_id" {
  command = plan

  assert {
    condition     = aws_launch_template.gpu.image_id == "ami-0latest00000000"
    error_message = "the AMI must be resolved at plan time (a diff), not by resolve:ssm: at launch"
  }
}

run "pool_hooks_user_data_and_scaling" {
  command = plan

  variables {
    ami_id           = "ami-0pinned0000000"
    scale_in_drain_s = 120
  }

  assert {
    condition     = aws_launch_template.gpu.image_id == "ami-0pinned0000000"
    error_message = "a pinned ami_id must be launched as is (rollback = the previous ID)"
  }

  # Changing an initial_lifecycle_hook replaces the group: only the constant launch hook is one.
  assert {
    condition     = [for h in aws_autoscaling_group.gpu.initial_lifecycle_hook : h.lifecycle_transition] == ["autoscaling:EC2_INSTANCE_LAUNCHING"]
    error_message = "the terminate hook (scale_in_drain_s) must not be an initial_lifecycle_hook"
  }

  assert {
    condition     = aws_autoscaling_lifecycle_hook.drain.heartbeat_timeout == 120 && aws_autoscaling_lifecycle_hook.drain.lifecycle_transition == "autoscaling:EC2_INSTANCE_TERMINATING"
    error_message = "scale_in_drain_s belongs to the separate terminate hook"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "trap 'abandon $LINENO' ERR")
    error_message = "user data must abandon the launch at once when a step fails"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "--lifecycle-action-result ABANDON")
    error_message = "user data must abandon the launch at once when a step fails"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "python3 -m gpu_container.triton.host_agent --group fg-gpu-llama")
    error_message = "the host agent (health, hooks, drain) must run on every host"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "--log-driver awslogs")
    error_message = "Triton's log must leave the host"
  }

  assert {
    condition     = aws_autoscaling_group.gpu.wait_for_capacity_timeout == "30m"
    error_message = "apply waits long enough for the engine download"
  }

  assert {
    condition     = contains([for m in one(one(aws_autoscaling_policy.demand_target.target_tracking_configuration).customized_metric_specification).metrics : m.expression if m.return_data == true], "MAX([demand / 6, replica_load])")
    error_message = "target tracking follows the larger of the edges' demand and the replicas' own load"
  }

  assert {
    condition     = contains([for q in aws_cloudwatch_metric_alarm.from_zero.metric_query : q.expression if q.return_data == true], "IF(desired < 1, demand, 0)") && aws_autoscaling_policy.from_zero.adjustment_type == "ExactCapacity"
    error_message = "demand with no host wanted must start one (target tracking cannot leave zero)"
  }
}

# AWS keeps MaxGroupPreparedCapacity minus the hosts in service warm (at least the pool's min_size),
# and max_size minus them when it is unset: the pool has the size asked for only where the two are
# equal (AWS's PutWarmPool reference; AWS itself cannot run here, the plan's values are checked).
run "the_warm_pool_keeps_warm_pool_min_size_hosts" {
  command = plan

  variables {
    max_size           = 8
    warm_pool_min_size = 2
  }

  assert {
    condition     = one(aws_autoscaling_group.gpu.warm_pool).max_group_prepared_capacity == 2 && one(aws_autoscaling_group.gpu.warm_pool).min_size == 2
    error_message = "unset, the warm pool grew to max_size minus the hosts in service (7 stopped GPU hosts at one in service), not warm_pool_min_size"
  }
}

run "a_warm_pool_that_grows_to_max_size_on_request" {
  command = plan

  variables {
    warm_pool_max_prepared = -1
  }

  assert {
    condition     = one(aws_autoscaling_group.gpu.warm_pool).max_group_prepared_capacity == -1
    error_message = "-1 is AWS's own default, kept for an operator who wants it"
  }
}

# A dot (usual in model names: llama-3.1-8b) is not allowed in a lifecycle hook's name, which the
# group's name makes: refused at plan, not by the Auto Scaling API half-way through an apply.
run "a_group_name_aws_cannot_take" {
  command = plan

  variables {
    group_name = "fg-gpu-llama-3.1-8b"
  }

  expect_failures = [var.group_name]
}

# The model's name is the clients' (printable ASCII but '/', the edge's and CloudWatch's rule), and
# the hosts' security group's description names it. EC2 takes a description in a-z, A-Z, 0-9,
# spaces and ._-:/()#,@[]+=&;{}!$* only: a name with any other character (a quote, a '?', a '~')
# planned clean and CreateSecurityGroup refused it at apply, the role and log group already made.
run "a_model_name_ec2_refuses_in_a_security_group_description" {
  command = plan

  variables {
    model = "llama-3.1-8b 'fast'?~"
  }

  assert {
    condition     = can(regex("^[A-Za-z0-9 ._:/()#,@\\[\\]+=&;{}!$*-]{0,255}$", aws_security_group.gpu.description))
    error_message = "the security group's description must hold only what EC2 takes (a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$*), 255 characters at most"
  }
}

# A model's name EC2 takes in a description is left as it is: changing a security group's
# description replaces the group, which its running hosts hold.
run "a_model_name_ec2_takes_names_its_security_group" {
  command = plan

  variables {
    model = "llama-3.1-8b (fp8)"
  }

  assert {
    condition     = aws_security_group.gpu.description == "GPU hosts of llama-3.1-8b (fp8): Triton HTTP and metrics from the edge"
    error_message = "a description EC2 takes must not change: a new one replaces the group"
  }
}

# A warm-pool host re-reads its whole engine from the root volume when it starts: at gp3's baseline
# (125 MiB/s) a 16 GB engine takes over 2 minutes, a 70 GB one 9. Provisioned for engine loading.
run "root_volume_is_provisioned_for_loading_the_engine" {
  command = plan

  assert {
    condition     = one(one(aws_launch_template.gpu.block_device_mappings).ebs).throughput == 1000
    error_message = "the root volume reads at gp3's highest throughput (1000 MiB/s), not the 125 MiB/s baseline"
  }

  assert {
    condition     = one(one(aws_launch_template.gpu.block_device_mappings).ebs).iops == 6000
    error_message = "the root volume has the IOPS its throughput needs (at least 4 per MiB/s) and some to spare"
  }

  assert {
    condition     = one(one(aws_launch_template.gpu.block_device_mappings).ebs).volume_type == "gp3"
    error_message = "gp3: throughput and IOPS provisioned apart from the size"
  }
}

run "root_volume_settings_gp3_accepts" {
  command = plan

  variables {
    root_volume_gb               = 400
    root_volume_iops             = 4000
    root_volume_throughput_mibps = 1000
  }

  assert {
    condition     = one(one(aws_launch_template.gpu.block_device_mappings).ebs).volume_size == 400
    error_message = "the root volume takes root_volume_gb"
  }
}

run "root_volume_throughput_above_gp3s" {
  command = plan

  variables {
    root_volume_throughput_mibps = 2000
  }

  expect_failures = [var.root_volume_throughput_mibps]
}

run "root_volume_iops_below_gp3s" {
  command = plan

  variables {
    root_volume_iops = 1000
  }

  expect_failures = [var.root_volume_iops]
}

run "root_volume_size_zero" {
  command = plan

  variables {
    root_volume_gb = 0
  }

  expect_failures = [var.root_volume_gb]
}

# gp3 allows 0.25 MiB/s per provisioned IOPS: 1000 MiB/s needs 4000 IOPS.
run "root_volume_throughput_above_its_iops" {
  command = plan

  variables {
    root_volume_iops             = 3000
    root_volume_throughput_mibps = 1000
  }

  expect_failures = [aws_launch_template.gpu]
}

# gp3 allows 500 IOPS per GiB: 6000 IOPS need 12 GiB.
run "root_volume_iops_above_its_size" {
  command = plan

  variables {
    root_volume_gb = 10
  }

  expect_failures = [aws_launch_template.gpu]
}

# The surge alarm fires on demand at or above surge_demand, and Auto Scaling runs its policy again
# every minute the alarm stays in ALARM. At or below demand_target it is in ALARM whenever target
# tracking holds the group where it should: +50 % hosts, target tracking scales them in again,
# and again, for as long as there is traffic.
run "a_surge_threshold_at_or_below_the_target" {
  command = plan

  variables {
    demand_target = 0.8
    surge_demand  = 0.7
  }

  expect_failures = [aws_cloudwatch_metric_alarm.demand_surge]
}

# surge_demand is also the step policy's bound: at 0 its first step is the empty interval [0, 0),
# which PutScalingPolicy refuses half-way through an apply.
run "a_surge_threshold_of_zero" {
  command = plan

  variables {
    surge_demand = 0
  }

  expect_failures = [var.surge_demand]
}

# Target tracking cannot hold a demand of 0: any demand at all reads as infinitely over target.
run "a_demand_target_of_zero" {
  command = plan

  variables {
    demand_target = 0
  }

  expect_failures = [var.demand_target]
}

# Above 1 the target asks for more work than the replicas do at a full batch, and the replicas' own
# load, the floor that keeps saturated GPUs from scaling in, reads at most 1.0 on the pinned
# TensorRT-LLM backend (no count of waiting requests): at 1.2 a saturated group of 8 whose edges
# under-count their demand reads 1.0 and target tracking takes it to ceil(8 x 1.0 / 1.2) = 7.
run "a_demand_target_above_a_full_batch" {
  command = plan

  variables {
    demand_target = 1.2
    surge_demand  = 1.5
  }

  expect_failures = [var.demand_target]
}

# A full batch itself is a target (saturated GPUs then hold their size, never shrink).
run "a_demand_target_of_a_full_batch" {
  command = plan

  variables {
    demand_target = 1
  }

  assert {
    condition     = one(aws_autoscaling_policy.demand_target.target_tracking_configuration).target_value == 1
    error_message = "a demand_target of 1.0 is taken"
  }
}

# CreateAutoScalingGroup refuses a min_size above max_size ("Max bound ... must be greater than or
# equal to min bound"), after the launch template, role and log group were created.
run "min_size_above_max_size" {
  command = plan

  variables {
    min_size = 4
    max_size = 2
  }

  expect_failures = [aws_autoscaling_group.gpu]
}

# A negative min_size passed the plan (the provider does not check it, and min <= max holds for -1
# and 2): CreateAutoScalingGroup refused it only at apply, the role, log group and launch template
# made. max_size is then at least 0 by the group's precondition.
run "a_negative_min_size" {
  command = plan

  variables {
    min_size = -1
    max_size = 2
  }

  expect_failures = [var.min_size]
}

# The hosts may read their engine's objects only. An engine uploaded at the bucket's root
# (engine_prefix "") is the whole bucket: "<bucket>//*" matched no key, and every host got 403 on
# the manifest, never got ready and was replaced, again and again.
run "an_engine_at_the_buckets_root_is_readable" {
  command = plan

  variables {
    engine_s3_uri = "s3://fg-engines/"
  }

  assert {
    condition     = one([for s in data.aws_iam_policy_document.gpu.statement : s.resources if s.sid == "ReadEngine"]) == toset(["arn:aws:s3:::fg-engines/*"])
    error_message = "the hosts' role must cover the engine's objects at the bucket's root"
  }
}

run "an_engines_prefix_is_its_own" {
  command = plan

  assert {
    condition     = one([for s in data.aws_iam_policy_document.gpu.statement : s.resources if s.sid == "ReadEngine"]) == toset(["arn:aws:s3:::fg-engines/engines/llama/l40s/*"])
    error_message = "the hosts' role covers their own engine's prefix only"
  }
}

# The host agent asks, when it starts, whether its launch hook is pending: without the permission
# an agent restarted on a host in service takes it for a fresh launch, and a dead Triton there waits
# out the ready timeout (29 minutes) before it is marked Unhealthy.
run "the_host_agent_may_read_its_lifecycle_state" {
  command = plan

  assert {
    condition     = one([for s in data.aws_iam_policy_document.gpu.statement : s.actions if s.sid == "DescribeOwnLifecycle"]) == toset(["autoscaling:DescribeAutoScalingInstances"]) && one([for s in data.aws_iam_policy_document.gpu.statement : s.resources if s.sid == "DescribeOwnLifecycle"]) == toset(["*"])
    error_message = "the hosts' role must allow autoscaling:DescribeAutoScalingInstances (no resource-level permission: \"*\")"
  }
}

# Session Manager replaces SSH, and is all the hosts use of SSM: they read no parameter (the AMI's is
# read by Terraform at plan). AWS's AmazonSSMManagedInstanceCore also grants ssm:GetParameter(s) on
# every parameter of the account (other deployments' secrets among them) and State Manager,
# inventory and patching: the hosts' role carries Session Manager's own actions instead.
run "session_manager_is_all_the_hosts_may_do_with_ssm" {
  command = plan

  assert {
    condition = one([for s in data.aws_iam_policy_document.gpu.statement : s.actions if s.sid == "SessionManagerRegister"]) == toset(["ssm:UpdateInstanceInformation"]) && one([for s in data.aws_iam_policy_document.gpu.statement : s.actions if s.sid == "SessionManagerChannels"]) == toset([
      "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel",
      "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage", "ec2messages:FailMessage",
      "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply",
    ])
    error_message = "the hosts' role must allow Session Manager's own actions (the managed AmazonSSMManagedInstanceCore policy reads every parameter of the account)"
  }

  assert {
    condition     = one([for s in data.aws_iam_policy_document.gpu.statement : s.resources if s.sid == "SessionManagerRegister"]) == toset(["arn:aws:ec2:us-east-1:111122223333:instance/*"])
    error_message = "the SSM agent registers an instance of this account and region"
  }

  assert {
    condition     = alltrue([for s in data.aws_iam_policy_document.gpu.statement : alltrue([for a in s.actions : !startswith(a, "ssm:GetParameter")])])
    error_message = "the hosts read no SSM parameter"
  }
}

# An instance refresh keeps ceil(min_healthy_percentage x desired / 100) hosts in service (AWS
# rounds the minimum up) and never more than max_healthy_percentage x desired / 100 in service or
# pending (a whole host: 120 % of one host is one). It moves only where the one lies below the
# group's size (it may terminate first) or the other above it (it may launch first). 90 / 120 on a
# group of one or two hosts, the usual GPU group, allowed neither: a new AMI, image or engine
# never reached the hosts.
run "an_instance_refresh_moves_a_group_of_one_or_two_hosts" {
  command = plan

  variables {
    min_size = 1
    max_size = 2
  }

  assert {
    condition = alltrue([for n in [1, 2] : (
      floor(one(one(aws_autoscaling_group.gpu.instance_refresh).preferences).max_healthy_percentage * n / 100) > n ||
      ceil(one(one(aws_autoscaling_group.gpu.instance_refresh).preferences).min_healthy_percentage * n / 100) < n
    )])
    error_message = "at one or two hosts the refresh may neither launch a replacement first nor take a host out: it never moves"
  }

  # Launch first: the group never drops below its size while a host is replaced (its streams drain).
  assert {
    condition     = one(one(aws_autoscaling_group.gpu.instance_refresh).preferences).min_healthy_percentage == 100
    error_message = "a refresh keeps every host the group wants in service, launching each replacement first"
  }
}

# 100 / 150 moves a group of two or more hosts (a third launches first) but not one host: 150 % of
# one is one. Refused at plan rather than a refresh that never finishes.
run "a_refresh_that_cannot_move_one_host" {
  command = plan

  variables {
    refresh_max_healthy_percentage = 150
  }

  expect_failures = [aws_autoscaling_group.gpu]
}

# A group that never runs fewer than two hosts may launch half of them first (100 / 150: a host more
# at two or three, less GPU quota than 200 %): it moves at every size it can have, and was refused
# because one host, a size it never has, could not.
run "a_refresh_of_half_a_group_that_never_falls_to_one_host" {
  command = plan

  variables {
    min_size                       = 2
    refresh_max_healthy_percentage = 150
  }

  assert {
    condition     = one(one(aws_autoscaling_group.gpu.instance_refresh).preferences).max_healthy_percentage == 150
    error_message = "a pair that moves the group at every size from min_size up is taken"
  }
}

# Terminate first: a single host is taken out before its replacement is in service (cheaper, with
# an outage at one host), and the refresh moves.
run "a_refresh_that_takes_hosts_out_first" {
  command = plan

  variables {
    refresh_min_healthy_percentage = 0
    refresh_max_healthy_percentage = 100
  }

  assert {
    condition     = one(one(aws_autoscaling_group.gpu.instance_refresh).preferences).max_healthy_percentage == 100
    error_message = "a refresh that terminates first is allowed: it moves"
  }
}

# The terminate hook's timeout is when a scaled-in host's streams are cut. The longest reply a tier
# allows is 4096 tokens (paid, edge/defaults.toml; tests/iac/test_structure.py keeps the two
# equal), placed up to 15 s after the drain began (the edges' discovery_interval_s): at 8 tokens a
# second (a large model at a full batch on a small GPU, or streams paused while the KV cache is
# full) 527 s. The 300 s this was covered 4096 tokens only above 14 tokens a second. The host agent
# completes the hook as soon as the last stream ends: a longer bound costs nothing on a quiet host.
run "the_default_drain_outlasts_the_longest_reply_at_a_slow_decode" {
  command = plan

  assert {
    condition     = aws_autoscaling_lifecycle_hook.drain.heartbeat_timeout >= 4096 / 8 + 15
    error_message = "a host scaled in cuts a paid tier's longest reply (4096 tokens) decoding at 8 tokens a second"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "--drain-s ${aws_autoscaling_lifecycle_hook.drain.heartbeat_timeout} ")
    error_message = "the host agent completes the hook at the latest when the hook itself would"
  }
}

# AWS's HeartbeatTimeout takes 30 to 7200 s: anything else failed PutLifecycleHook half-way
# through an apply.
run "a_drain_shorter_than_aws_allows" {
  command = plan

  variables {
    scale_in_drain_s = 10
  }

  expect_failures = [var.scale_in_drain_s]
}

run "a_drain_longer_than_aws_allows" {
  command = plan

  variables {
    scale_in_drain_s = 7201
  }

  expect_failures = [var.scale_in_drain_s]
}

# Who reaches a host: the edge, on the two Triton ports it uses (HTTP for the streams, metrics for
# the replica's load). Not the range 8000-8002, which admitted Triton's gRPC port 8001 as well: the
# same inference, model-control and shared-memory APIs on a port no client of the hosts speaks.
run "only_the_edge_reaches_only_the_ports_it_uses" {
  command = plan

  assert {
    condition = toset(flatten([
      for rule in aws_security_group.gpu.ingress : range(rule.from_port, rule.to_port + 1)
    ])) == toset([8000, 8002])
    error_message = "the hosts admit Triton's HTTP (8000) and metrics (8002) ports, and no other (gRPC 8001 is unused)"
  }

  assert {
    condition = alltrue([
      for rule in aws_security_group.gpu.ingress :
      rule.security_groups == toset(["sg-edge"]) && length(coalesce(rule.cidr_blocks, [])) == 0 && rule.protocol == "tcp"
    ])
    error_message = "only the edge's security group reaches the hosts"
  }
}
