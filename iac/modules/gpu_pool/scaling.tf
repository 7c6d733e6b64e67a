# Scaling on demand per replica (edge/scaling/): the GPU work the model is asked for, as a fraction of
# what its replicas do at a full batch. Every edge instance samples (the replica-seconds its requests
# asked for per second, served or refused) / (the live replicas it sees) every sample interval; the
# sum over all edges in one period, divided by the samples each sends per period, is the fleet's
# demand per replica. The replicas' own reported load (running + waiting in TensorRT-LLM over their
# sequences, the same at every edge) is a floor: saturated GPUs never read as idle. Target tracking holds the larger of the
# two at demand_target; a step policy adds hosts in larger jumps past surge_demand; a third policy
# starts the first host when there is demand and the group's desired size is zero (target tracking multiplies
# the current size, so it cannot leave zero).

locals {
  demand_expression = "MAX([demand / ${var.metric_samples_per_period}, replica_load])"
}

resource "aws_autoscaling_policy" "demand_target" {
  name                      = "${var.group_name}-demand"
  autoscaling_group_name    = aws_autoscaling_group.gpu.name
  policy_type               = "TargetTrackingScaling"
  estimated_instance_warmup = 300

  target_tracking_configuration {
    target_value = var.demand_target

    customized_metric_specification {
      metrics {
        id          = "demand"
        return_data = false
        metric_stat {
          stat = "Sum"
          metric {
            namespace   = var.metric_namespace
            metric_name = var.demand_metric
            dimensions {
              name  = var.metric_model_dimension
              value = var.model
            }
          }
        }
      }

      metrics {
        id          = "replica_load"
        return_data = false
        metric_stat {
          stat = "Maximum"
          metric {
            namespace   = var.metric_namespace
            metric_name = var.replica_load_metric
            dimensions {
              name  = var.metric_model_dimension
              value = var.model
            }
          }
        }
      }

      metrics {
        id          = "demand_per_replica"
        label       = "Demand per ${var.model} replica"
        expression  = local.demand_expression
        return_data = true
      }
    }
  }
}

resource "aws_autoscaling_policy" "demand_surge" {
  name                      = "${var.group_name}-demand-surge"
  autoscaling_group_name    = aws_autoscaling_group.gpu.name
  policy_type               = "StepScaling"
  adjustment_type           = "PercentChangeInCapacity"
  min_adjustment_magnitude  = 1
  estimated_instance_warmup = 300

  # Bounds are relative to the alarm threshold (surge_demand).
  step_adjustment {
    metric_interval_lower_bound = 0
    metric_interval_upper_bound = var.surge_demand
    scaling_adjustment          = 50
  }

  step_adjustment {
    metric_interval_lower_bound = var.surge_demand
    scaling_adjustment          = 100
  }
}

resource "aws_cloudwatch_metric_alarm" "demand_surge" {
  alarm_name          = "${var.group_name}-demand-surge"
  alarm_description   = "Demand per ${var.model} replica above ${var.surge_demand}: scale out in steps"
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = var.surge_demand
  evaluation_periods  = 2
  datapoints_to_alarm = 2
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_autoscaling_policy.demand_surge.arn]

  metric_query {
    id = "demand"
    metric {
      namespace   = var.metric_namespace
      metric_name = var.demand_metric
      dimensions  = { (var.metric_model_dimension) = var.model }
      stat        = "Sum"
      period      = var.metric_period_s
    }
  }

  metric_query {
    id = "replica_load"
    metric {
      namespace   = var.metric_namespace
      metric_name = var.replica_load_metric
      dimensions  = { (var.metric_model_dimension) = var.model }
      stat        = "Maximum"
      period      = var.metric_period_s
    }
  }

  metric_query {
    id          = "demand_per_replica"
    label       = "Demand per ${var.model} replica"
    expression  = local.demand_expression
    return_data = true
  }

  lifecycle {
    # Auto Scaling runs an alarm's policy again every minute the alarm stays in ALARM. At or below
    # demand_target this one is in ALARM exactly where target tracking holds the group: it adds
    # 50 % hosts, target tracking scales them in again, and so on for as long as there is traffic.
    precondition {
      condition     = var.surge_demand > var.demand_target
      error_message = "surge_demand must be above demand_target: at or below it the surge alarm fires wherever target tracking holds the group, and the two policies scale it out and in by turns."
    }
  }
}

# Scale from zero: with no replica the edges still count the requests they turn away
# (reason no_replica), so demand is above zero; this starts one host, and target tracking takes it
# from there.
resource "aws_autoscaling_policy" "from_zero" {
  name                   = "${var.group_name}-from-zero"
  autoscaling_group_name = aws_autoscaling_group.gpu.name
  policy_type            = "StepScaling"
  adjustment_type        = "ExactCapacity"

  step_adjustment {
    metric_interval_lower_bound = 0
    scaling_adjustment          = 1
  }
}

resource "aws_cloudwatch_metric_alarm" "from_zero" {
  alarm_name          = "${var.group_name}-from-zero"
  alarm_description   = "Requests for ${var.model} and no host wanted: start one"
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  evaluation_periods  = 1
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_autoscaling_policy.from_zero.arn]

  metric_query {
    id = "demand"
    metric {
      namespace   = var.metric_namespace
      metric_name = var.demand_metric
      dimensions  = { (var.metric_model_dimension) = var.model }
      stat        = "Sum"
      period      = var.metric_period_s
    }
  }

  # Desired, not in service: while the first host boots (desired 1, in service 0) this stays quiet.
  metric_query {
    id = "desired"
    metric {
      namespace   = "AWS/AutoScaling"
      metric_name = "GroupDesiredCapacity"
      dimensions  = { AutoScalingGroupName = var.group_name }
      stat        = "Maximum"
      period      = var.metric_period_s
    }
  }

  metric_query {
    id          = "unserved_demand"
    label       = "Demand for ${var.model} with no host wanted"
    expression  = "IF(desired < 1, demand, 0)"
    return_data = true
  }
}
