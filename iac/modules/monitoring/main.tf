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

resource "aws_cloudwatch_metric_alarm" "no_healthy_gpu_hosts" {
  for_each            = var.gpu_groups
  alarm_name          = "${var.name}-${each.key}-no-healthy-gpu-hosts"
  alarm_description   = "No ${each.key} GPU host in service: every request for the model waits or fails"
  namespace           = "AWS/AutoScaling"
  metric_name         = "GroupInServiceInstances"
  dimensions          = { AutoScalingGroupName = each.value }
  statistic           = "Minimum"
  period              = 60
  evaluation_periods  = 3
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "breaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
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
