# The GPU pool's scaling metric, as the edge publishes it. These values are defined in
# edge/scaling_metric.py; tests/iac/test_scaling_metric.py fails if the two drift apart.

output "namespace" {
  description = "CloudWatch namespace of the metrics the edge publishes."
  value       = "Floodgate"
}

output "metric_name" {
  description = "Requests waiting at one edge instance per GPU replica of the model, sampled every sample_interval_s."
  value       = "QueueDepthPerReplica"
}

output "model_dimension" {
  description = "Name of the dimension that carries the served model's name."
  value       = "Model"
}

output "period_s" {
  description = "Aggregation period of the metric in the scaling policies and alarms."
  value       = 60
}

output "samples_per_period" {
  description = "Samples each edge instance sends per period: Sum / samples_per_period is the fleet's backlog per replica."
  value       = 6
}
