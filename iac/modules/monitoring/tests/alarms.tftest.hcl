# The alarms planned against a mocked AWS provider (no account needed).

mock_provider "aws" {
  override_during = plan

  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
}

variables {
  name                      = "fg"
  kms_key_arn               = "arn:aws:kms:us-east-1:111122223333:key/abc"
  alb_arn_suffix            = "app/fg/abc"
  target_group_arn_suffix   = "targetgroup/fg-edge/abc"
  ecs_cluster_name          = "fg"
  ecs_service_name          = "edge"
  gpu_groups                = { "llama-3.1-8b" = "fg-gpu-llama-3-1-8b" }
  metric_namespace          = "Floodgate"
  demand_metric             = "DemandPerReplica"
  replica_load_metric       = "ReplicaLoadPerReplica"
  metric_model_dimension    = "Model"
  metric_period_s           = 60
  metric_samples_per_period = 6
}

# A model may run from zero hosts (min_size 0: its group starts one on demand, and target tracking
# takes it back to zero when idle). The alarm on no host in service read GroupInServiceInstances
# alone, so such a model paged every idle minute, night after night, and an operator learned to
# ignore the one alarm that says a model serves nobody. It now pages only while the group wants a
# host (GroupDesiredCapacity at least 1, the whole minute) and has none in service: a group that
# keeps min_size hosts alarms as before, one at zero only when its demand got no host.
run "no_host_pages_only_while_the_group_wants_one" {
  command = plan

  assert {
    condition = toset([
      for q in aws_cloudwatch_metric_alarm.no_healthy_gpu_hosts["llama-3.1-8b"].metric_query :
      "${q.id}:${one(q.metric).metric_name}:${one(q.metric).stat}:${one(q.metric).dimensions["AutoScalingGroupName"]}"
      if length(q.metric) > 0
      ]) == toset([
      "in_service:GroupInServiceInstances:Minimum:fg-gpu-llama-3-1-8b",
      "desired:GroupDesiredCapacity:Minimum:fg-gpu-llama-3-1-8b",
    ])
    error_message = "The no-host alarm must read the group's in-service hosts and its desired capacity."
  }

  assert {
    condition = [
      for q in aws_cloudwatch_metric_alarm.no_healthy_gpu_hosts["llama-3.1-8b"].metric_query :
      q.expression if q.return_data == true
    ] == ["IF(desired >= 1 AND in_service < 1, 1, 0)"]
    error_message = "The no-host alarm must fire only while the group wants a host and has none in service."
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.no_healthy_gpu_hosts["llama-3.1-8b"].threshold == 1 && aws_cloudwatch_metric_alarm.no_healthy_gpu_hosts["llama-3.1-8b"].comparison_operator == "GreaterThanOrEqualToThreshold"
    error_message = "The no-host alarm fires when its expression reads 1."
  }

  # Group metrics gone (collection turned off, the group deleted) still page, as before.
  assert {
    condition     = aws_cloudwatch_metric_alarm.no_healthy_gpu_hosts["llama-3.1-8b"].treat_missing_data == "breaching"
    error_message = "Missing group metrics must still page."
  }
}

# Every edge sends each model's scaling metric every sample, 0 when idle (edge/scaling/). With none
# arriving (no edge running, its CloudWatch calls failing: a role, a region, an endpoint lost), the
# scaling alarms read missing data as not breaching: the group held its size under any load, and
# one at zero never started a host, with nothing to say so. The missing metric itself now pages.
run "edges_not_publishing_the_scaling_metric_pages" {
  command = plan

  override_resource {
    target          = aws_sns_topic.alarms
    override_during = plan
    values          = { arn = "arn:aws:sns:us-east-1:111122223333:fg-alarms" }
  }

  assert {
    condition = join(":", [
      aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].namespace,
      aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].metric_name,
      aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].statistic,
      aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].dimensions["Model"],
    ]) == "Floodgate:DemandPerReplica:SampleCount:llama-3.1-8b"
    error_message = "The missing-metric alarm must count the model's DemandPerReplica samples."
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].treat_missing_data == "breaching" && aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].comparison_operator == "LessThanThreshold" && aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].threshold == 1
    error_message = "No sample in a period (no datapoint at all) must breach."
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.scaling_metric_missing["llama-3.1-8b"].alarm_actions == toset(["arn:aws:sns:us-east-1:111122223333:fg-alarms"])
    error_message = "The missing-metric alarm must notify the alarm topic."
  }
}

# A dashboard widget's `metrics` is an array of metric arrays (CloudWatch's dashboard body
# structure): one array per metric or expression. The demand widget's list was built with flatten(),
# which flattens nested lists all the way down: its metrics became one flat list of strings and
# objects, not a metric among them, which CloudWatch refuses as a dashboard body.
run "each_dashboard_metric_is_an_array" {
  command = plan

  variables {
    gpu_groups = { "llama-3.1-8b" = "fg-gpu-llama-3-1-8b", "qwen" = "fg-gpu-qwen" }
  }

  assert {
    condition = alltrue([
      for w in jsondecode(aws_cloudwatch_dashboard.this.dashboard_body).widgets :
      alltrue([for m in w.properties.metrics : can(m[0])])
    ])
    error_message = "Every entry of a widget's metrics must be an array (a metric or an expression)."
  }

  assert {
    condition = [
      for m in jsondecode(aws_cloudwatch_dashboard.this.dashboard_body).widgets[0].properties.metrics :
      m[length(m) - 1].label if can(m[length(m) - 1].expression)
    ] == ["llama-3.1-8b", "qwen"]
    error_message = "The demand widget must draw one line per model."
  }
}
