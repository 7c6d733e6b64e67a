# Scaling on queue depth. Every edge instance sends its samples of "requests waiting per replica";
# the sum over all of them in one period, divided by the samples each sends per period, is the
# fleet's backlog per replica. Target tracking holds it at queue_depth_target; a step policy adds
# hosts in larger jumps when a surge pushes it past surge_queue_depth.

locals {
  backlog_expression = "queued / ${var.metric_samples_per_period}"
}

resource "aws_autoscaling_policy" "queue_depth_target" {
  name                      = "${var.group_name}-queue-depth"
  autoscaling_group_name    = aws_autoscaling_group.gpu.name
  policy_type               = "TargetTrackingScaling"
  estimated_instance_warmup = 300

  target_tracking_configuration {
    target_value = var.queue_depth_target

    customized_metric_specification {
      metrics {
        id          = "queued"
        return_data = false
        metric_stat {
          stat = "Sum"
          metric {
            namespace   = var.metric_namespace
            metric_name = var.metric_name
            dimensions {
              name  = var.metric_model_dimension
              value = var.model
            }
          }
        }
      }

      metrics {
        id          = "backlog_per_replica"
        label       = "Requests waiting per ${var.model} replica"
        expression  = local.backlog_expression
        return_data = true
      }
    }
  }
}

resource "aws_autoscaling_policy" "queue_depth_surge" {
  name                      = "${var.group_name}-queue-surge"
  autoscaling_group_name    = aws_autoscaling_group.gpu.name
  policy_type               = "StepScaling"
  adjustment_type           = "PercentChangeInCapacity"
  min_adjustment_magnitude  = 1
  estimated_instance_warmup = 300

  # Bounds are relative to the alarm threshold (surge_queue_depth).
  step_adjustment {
    metric_interval_lower_bound = 0
    metric_interval_upper_bound = var.surge_queue_depth
    scaling_adjustment          = 50
  }

  step_adjustment {
    metric_interval_lower_bound = var.surge_queue_depth
    scaling_adjustment          = 100
  }
}

resource "aws_cloudwatch_metric_alarm" "queue_depth_surge" {
  alarm_name          = "${var.group_name}-queue-surge"
  alarm_description   = "Backlog per ${var.model} replica above ${var.surge_queue_depth}: scale out in steps"
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = var.surge_queue_depth
  evaluation_periods  = 2
  datapoints_to_alarm = 2
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_autoscaling_policy.queue_depth_surge.arn]

  metric_query {
    id = "queued"
    metric {
      namespace   = var.metric_namespace
      metric_name = var.metric_name
      dimensions  = { (var.metric_model_dimension) = var.model }
      stat        = "Sum"
      period      = var.metric_period_s
    }
  }

  metric_query {
    id          = "backlog_per_replica"
    label       = "Requests waiting per ${var.model} replica"
    expression  = local.backlog_expression
    return_data = true
  }
}
