# The GPU pool's scaling signal, as the edge publishes it. These values are defined in
# edge/scaling/metric.py; tests/iac/test_scaling_metric.py fails if the two drift apart.

output "namespace" {
  description = "CloudWatch namespace of the metrics the edge publishes."
  value       = "Floodgate"
}

output "demand_metric" {
  description = "The replica-seconds (at a full batch) one edge's requests asked for per second, served or refused, over the live replicas it sees; sampled every sample interval, summed over the edges."
  value       = "DemandPerReplica"
}

output "replica_load_metric" {
  description = "The replicas' own reported running + waiting sequences over their sequences: the same at every edge (Maximum over them)."
  value       = "ReplicaLoadPerReplica"
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
  description = "Samples each edge instance sends per period: Sum / samples_per_period is the fleet's demand per replica."
  value       = 6
}
