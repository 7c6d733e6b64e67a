locals {
  # Each edge sends one sample of demand every sample interval (edge/scaling/metric.py).
  sample_interval_s = var.metric_period_s / var.metric_samples_per_period

  # A widget's metrics are an array of metric arrays: the models' rows joined with concat, as
  # flatten() would flatten each row too (one flat list of strings, which CloudWatch refuses).
  backlog_metrics = concat([], [
    for i, model in keys(var.gpu_groups) : [
      [var.metric_namespace, var.demand_metric, var.metric_model_dimension, model, { id = "d${i}", stat = "Sum", visible = false }],
      [var.metric_namespace, var.replica_load_metric, var.metric_model_dimension, model, { id = "r${i}", stat = "Maximum", visible = false }],
      # Sum / the samples an edge sends per period, at the period the graph is drawn at: a
      # dashboard's period grows with its time range (periodOverride auto), and / 6 (one minute's
      # samples) drew a day's 5-minute points at 5 x the demand, a week's hourly ones at 60 x.
      [{ expression = "MAX([d${i} * ${local.sample_interval_s} / PERIOD(d${i}), r${i}])", label = model }],
    ]
  ]...)

  in_service_metrics = [
    for model, group in var.gpu_groups :
    ["AWS/AutoScaling", "GroupInServiceInstances", "AutoScalingGroupName", group, { label = "${model} in service" }]
  ]

  warm_metrics = [
    for model, group in var.gpu_groups :
    ["AWS/AutoScaling", "WarmPoolWarmedCapacity", "AutoScalingGroupName", group, { label = "${model} warm" }]
  ]

  widgets = [
    { title = "Demand per GPU replica (1.0: every replica wanted at a full batch)", metrics = local.backlog_metrics },
    { title = "GPU hosts in service and warm", metrics = concat(local.in_service_metrics, local.warm_metrics) },
    {
      title = "Requests and 5xx"
      metrics = [
        ["AWS/ApplicationELB", "RequestCount", "LoadBalancer", var.alb_arn_suffix, { stat = "Sum" }],
        ["AWS/ApplicationELB", "HTTPCode_ELB_5XX_Count", "LoadBalancer", var.alb_arn_suffix, { stat = "Sum" }],
        ["AWS/ApplicationELB", "HTTPCode_Target_5XX_Count", "LoadBalancer", var.alb_arn_suffix, { stat = "Sum" }],
      ]
    },
    {
      title = "Open connections and response time"
      metrics = [
        ["AWS/ApplicationELB", "ActiveConnectionCount", "LoadBalancer", var.alb_arn_suffix, { stat = "Sum" }],
        ["AWS/ApplicationELB", "TargetResponseTime", "LoadBalancer", var.alb_arn_suffix, { stat = "p99", yAxis = "right" }],
      ]
    },
    {
      title = "Edge CPU and tasks"
      metrics = [
        ["AWS/ECS", "CPUUtilization", "ClusterName", var.ecs_cluster_name, "ServiceName", var.ecs_service_name],
        ["ECS/ContainerInsights", "RunningTaskCount", "ClusterName", var.ecs_cluster_name, "ServiceName", var.ecs_service_name, { yAxis = "right" }],
      ]
    },
  ]
}

data "aws_region" "current" {}

resource "aws_cloudwatch_dashboard" "this" {
  dashboard_name = var.name
  dashboard_body = jsonencode({
    widgets = [
      for i, w in local.widgets : {
        type   = "metric"
        x      = (i % 2) * 12
        y      = floor(i / 2) * 6
        width  = 12
        height = 6
        properties = {
          title   = w.title
          metrics = w.metrics
          region  = data.aws_region.current.name
          period  = var.metric_period_s
          view    = "timeSeries"
          stacked = false
        }
      }
    ]
  })
}
