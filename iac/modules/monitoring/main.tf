# Alarms that mean a person should look, all on one encrypted topic, and a dashboard of the path of a
# request: the ALB, the edge, the backlog in front of the GPUs and the GPU hosts themselves.

resource "aws_sns_topic" "alarms" {
  name              = "${var.name}-alarms"
  kms_master_key_id = var.kms_key_arn
}

resource "aws_sns_topic_subscription" "email" {
  for_each  = toset(var.alarm_emails)
  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = each.value
}

resource "aws_cloudwatch_metric_alarm" "demand_high" {
  for_each            = var.gpu_groups
  alarm_name          = "${var.name}-${each.key}-demand-high"
  alarm_description   = "Demand per ${each.key} replica stayed above ${var.demand_alarm} for 10 minutes: the GPU pool is not keeping up"
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.demand_alarm
  evaluation_periods  = 10
  datapoints_to_alarm = 10
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  metric_query {
    id = "demand"
    metric {
      namespace   = var.metric_namespace
      metric_name = var.demand_metric
      dimensions  = { (var.metric_model_dimension) = each.key }
      stat        = "Sum"
      period      = var.metric_period_s
    }
  }

  metric_query {
    id = "replica_load"
    metric {
      namespace   = var.metric_namespace
      metric_name = var.replica_load_metric
      dimensions  = { (var.metric_model_dimension) = each.key }
      stat        = "Maximum"
      period      = var.metric_period_s
    }
  }

  metric_query {
    id          = "demand_per_replica"
    expression  = "MAX([demand / ${var.metric_samples_per_period}, replica_load])"
    label       = "Demand per ${each.key} replica"
    return_data = true
  }
}

# The edges stopped sending a model's scaling metric. Every edge sends it every sample, 0 when idle
# (edge/scaling/), so none for 5 minutes means no edge runs or none reaches CloudWatch (its role, its
# region, a lost endpoint). The scaling alarms read missing data as not breaching (a scale-in on
# missing data would empty a busy group): the group then holds its size under any load and one at
# zero never starts a host, which only this says. A model served by no edge pages too: it is in
# var.gpu_groups, so a group is paid for it.
resource "aws_cloudwatch_metric_alarm" "scaling_metric_missing" {
  for_each            = var.gpu_groups
  alarm_name          = "${var.name}-${each.key}-scaling-metric-missing"
  alarm_description   = "No edge sent ${each.key}'s ${var.demand_metric} for 5 minutes: its GPU group no longer scales (it holds its size; from zero, it starts no host)"
  namespace           = var.metric_namespace
  metric_name         = var.demand_metric
  dimensions          = { (var.metric_model_dimension) = each.key }
  statistic           = "SampleCount"
  period              = var.metric_period_s
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  evaluation_periods  = 5
  treat_missing_data  = "breaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

# No host in service while the group wants one. A model may run from zero (min_size 0: its group
# starts a host on demand and target tracking takes it back to zero when idle), so "none in
# service" alone paged every idle minute of such a model. Desired at least 1 the whole minute (its
# Minimum) and none in service for 3 minutes: a group that keeps min_size hosts pages as before; one
# at zero pages only when its demand got no host (a warm-pool start takes about a minute; a cold
# start, the warm pool empty, may page). Group metrics gone (collection off) still page.
resource "aws_cloudwatch_metric_alarm" "no_healthy_gpu_hosts" {
  for_each            = var.gpu_groups
  alarm_name          = "${var.name}-${each.key}-no-healthy-gpu-hosts"
  alarm_description   = "No ${each.key} GPU host in service while its group wants one: every request for the model waits or fails"
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = 1
  evaluation_periods  = 3
  treat_missing_data  = "breaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  metric_query {
    id = "in_service"
    metric {
      namespace   = "AWS/AutoScaling"
      metric_name = "GroupInServiceInstances"
      dimensions  = { AutoScalingGroupName = each.value }
      stat        = "Minimum"
      period      = 60
    }
  }

  metric_query {
    id = "desired"
    metric {
      namespace   = "AWS/AutoScaling"
      metric_name = "GroupDesiredCapacity"
      dimensions  = { AutoScalingGroupName = each.value }
      stat        = "Minimum"
      period      = 60
    }
  }

  metric_query {
    id          = "wanted_and_none"
    label       = "${each.key}: a host wanted, none in service"
    expression  = "IF(desired >= 1 AND in_service < 1, 1, 0)"
    return_data = true
  }
}

resource "aws_cloudwatch_metric_alarm" "http_5xx" {
  alarm_name          = "${var.name}-5xx-rate"
  alarm_description   = "More than ${var.error_rate_alarm_percent}% of requests answered 5xx (load balancer or edge) over 5 minutes"
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.error_rate_alarm_percent
  evaluation_periods  = 5
  datapoints_to_alarm = 5
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  metric_query {
    id = "elb_5xx"
    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "HTTPCode_ELB_5XX_Count"
      dimensions  = { LoadBalancer = var.alb_arn_suffix }
      stat        = "Sum"
      period      = 60
    }
  }

  metric_query {
    id = "target_5xx"
    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "HTTPCode_Target_5XX_Count"
      dimensions  = { LoadBalancer = var.alb_arn_suffix, TargetGroup = var.target_group_arn_suffix }
      stat        = "Sum"
      period      = 60
    }
  }

  metric_query {
    id = "requests"
    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "RequestCount"
      dimensions  = { LoadBalancer = var.alb_arn_suffix }
      stat        = "Sum"
      period      = 60
    }
  }

  metric_query {
    id          = "error_rate"
    expression  = "100 * (FILL(elb_5xx, 0) + FILL(target_5xx, 0)) / MAX([requests, 1])"
    label       = "5xx % of requests"
    return_data = true
  }
}
