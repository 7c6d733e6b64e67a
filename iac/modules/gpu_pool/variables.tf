variable "group_name" {
  description = "Name of the Auto Scaling group (the edge finds its replicas by it); also prefixes the pool's other resources."
  type        = string

  # It names the lifecycle hooks ("<group>-ready", AWS allows [A-Za-z0-9-_/] there) and the hosts'
  # IAM role ("<group>-host", at most 64 characters of [A-Za-z0-9+=,.@_-]): only what both take.
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,59}$", var.group_name))
    error_message = "group_name must be 1 to 59 letters, digits, '-' or '_' (it names the group's lifecycle hooks and, with \"-host\", its IAM role): make a model's name safe for AWS before naming its group after it."
  }
}

variable "model" {
  description = "Served model's name, as clients pass it and as the scaling metric's Model dimension carries it."
  type        = string
}

variable "vpc_id" {
  description = "The VPC."
  type        = string
}

variable "private_subnet_ids" {
  description = "Subnets of the GPU hosts."
  type        = list(string)
}

variable "edge_security_group_id" {
  description = "The edge, the only client of Triton's HTTP and metrics ports."
  type        = string
}

variable "ami_id" {
  description = "GPU AMI to launch (NVIDIA driver, Docker, NVIDIA container toolkit). Pin it in production; empty reads ami_ssm_parameter at plan time, so a new AMI shows in the plan."
  type        = string
  default     = ""
}

variable "ami_ssm_parameter" {
  description = "SSM parameter naming the latest GPU AMI, read at plan time when ami_id is empty."
  type        = string
  default     = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

variable "instance_type" {
  description = "GPU instance type; the engine in S3 must have been built for its GPU."
  type        = string
  default     = "g6e.xlarge"
}

variable "root_volume_gb" {
  description = "Root EBS volume (gp3) in GiB: the container image plus the engine files."
  type        = number
  default     = 200
  nullable    = false

  validation {
    condition     = var.root_volume_gb >= 1 && var.root_volume_gb <= 16384 && floor(var.root_volume_gb) == var.root_volume_gb
    error_message = "root_volume_gb must be a whole number of GiB from 1 to 16384 (gp3)."
  }
}

# A warm-pool host re-reads its whole engine from the root volume each time it starts (the page
# cache is gone with the stop): at gp3's baseline 125 MiB/s a 16 GB engine takes 2 minutes and a
# 70 GB one 9, against the "about a minute" a warm start should take; at 1000 MiB/s, 15 s and 70 s.
# gp3 gives 0.25 MiB/s per provisioned IOPS (1000 MiB/s needs 4000) and 500 IOPS per GiB: both
# checked by the launch template's preconditions.
variable "root_volume_iops" {
  description = "Provisioned IOPS of the root volume (gp3: 3000 to 16000, 3000 included in the price; at least throughput x 4, at most 500 per GiB)."
  type        = number
  default     = 6000
  nullable    = false

  validation {
    condition     = var.root_volume_iops >= 3000 && var.root_volume_iops <= 16000 && floor(var.root_volume_iops) == var.root_volume_iops
    error_message = "root_volume_iops must be a whole number from 3000 to 16000 (gp3)."
  }
}

variable "root_volume_throughput_mibps" {
  description = "Provisioned throughput of the root volume in MiB/s (gp3: 125 to 1000, 125 included in the price): how fast a warm-pool host re-reads its engine when it starts."
  type        = number
  default     = 1000
  nullable    = false

  validation {
    condition     = var.root_volume_throughput_mibps >= 125 && var.root_volume_throughput_mibps <= 1000 && floor(var.root_volume_throughput_mibps) == var.root_volume_throughput_mibps
    error_message = "root_volume_throughput_mibps must be a whole number from 125 to 1000 MiB/s (gp3, as the AWS provider 5.x accepts it)."
  }
}

variable "min_size" {
  description = "Fewest in-service hosts (0: the group starts from zero on demand)."
  type        = number
  default     = 1

  # The provider does not check its sign: CreateAutoScalingGroup refused a negative one only at
  # apply, after the role, log group and launch template. max_size is held at or above it by the
  # group's precondition.
  validation {
    condition     = var.min_size >= 0 && floor(var.min_size) == var.min_size
    error_message = "min_size must be a whole number of hosts, 0 or more (0: the group starts from zero on demand)."
  }
}

variable "max_size" {
  description = "Most in-service hosts (the GPU budget)."
  type        = number
  default     = 8
}

variable "warm_pool_min_size" {
  description = "Stopped, pre-initialised hosts kept ready (engine already on disk): a scale-out starts one in about a minute instead of downloading the model (it re-reads the engine from its root volume: root_volume_throughput_mibps)."
  type        = number
  default     = 2
  nullable    = false
}

variable "warm_pool_max_prepared" {
  description = "AWS's MaxGroupPreparedCapacity: the warm pool holds this minus the hosts in service, at least warm_pool_min_size. Unset (null): warm_pool_min_size, the one setting where the pool has a fixed size; -1: AWS's default, max_size minus the hosts in service (7 stopped hosts, each with its provisioned root volume, for max_size 8 at one host in service)."
  type        = number
  default     = null
}

variable "triton_image" {
  description = "Triton + TensorRT-LLM image of gpu_container/triton (ECR URI with tag or digest)."
  type        = string
}

variable "ecr_repository_arn" {
  description = "ECR repository of triton_image (the hosts may pull from it only)."
  type        = string
}

variable "engine_bucket_arn" {
  description = "Bucket holding built engines."
  type        = string
}

variable "engine_s3_uri" {
  description = "s3://bucket/prefix/ of this model's engine for this instance type."
  type        = string
}

variable "kms_key_arn" {
  description = "Key of the EBS volumes and of the engine bucket."
  type        = string
}

variable "demand_target" {
  description = "Demand per replica that target tracking holds, as a fraction of a replica's full-batch work (1.0: every replica wanted at its full-batch throughput), above 0 and at most 1. Below 1 leaves headroom for a burst while hosts boot."
  type        = number
  default     = 0.8
  nullable    = false

  # Target tracking divides by it: at 0 any demand at all reads as infinitely over target. Above
  # 1 it asks for more work than the replicas do at a full batch (a queue that only grows), and the
  # replicas' own load, the floor that keeps saturated GPUs from scaling in, reads at most 1.0 on the
  # pinned TensorRT-LLM backend: a saturated group then read below target and was scaled in.
  validation {
    condition     = var.demand_target > 0 && var.demand_target <= 1
    error_message = "demand_target must be above 0 and at most 1 (a fraction of a replica's full-batch work, 0.8 by default): above 1 saturated GPUs, whose own load reads at most 1.0, would read below target and scale in."
  }
}

variable "surge_demand" {
  description = "Demand per replica that triggers the step policy's extra scale-out, for a burst target tracking would follow too slowly: above demand_target."
  type        = number
  default     = 1.5
  nullable    = false

  # It is also the step policy's interval bound (scaling.tf): at 0 or below, the first step is
  # empty or inverted, which PutScalingPolicy refuses half-way through an apply. That it lies above
  # demand_target is the surge alarm's precondition (a validation may not read another variable
  # before Terraform 1.9).
  validation {
    condition     = var.surge_demand > 0
    error_message = "surge_demand must be above 0, and above demand_target (demand per replica, 1.5 by default)."
  }
}

# An instance refresh (a new AMI, image or engine) keeps ceil(min % x desired) hosts in service and
# at most max % x desired (whole hosts) in service or pending. 100 / 200 launches every replacement
# before its host drains, at one host too; it needs GPU quota for twice the hosts in service while
# it runs. The group's precondition refuses a pair that leaves a refresh stuck at min_size (one host
# for a group from zero), the size where one is stuck first.
variable "refresh_min_healthy_percentage" {
  description = "Instance refresh: hosts kept in service, as a percentage of the desired capacity (rounded up). 100: never fewer than the group wants."
  type        = number
  default     = 100
  nullable    = false

  validation {
    condition     = var.refresh_min_healthy_percentage >= 0 && var.refresh_min_healthy_percentage <= 100 && floor(var.refresh_min_healthy_percentage) == var.refresh_min_healthy_percentage
    error_message = "refresh_min_healthy_percentage must be a whole number from 0 to 100 (AWS's range)."
  }
}

variable "refresh_max_healthy_percentage" {
  description = "Instance refresh: most hosts in service or pending, as a percentage of the desired capacity. 200: each replacement is launched before its host drains, at one host too (GPU quota for twice the hosts in service while a refresh runs)."
  type        = number
  default     = 200
  nullable    = false

  validation {
    condition     = var.refresh_max_healthy_percentage >= 100 && var.refresh_max_healthy_percentage <= 200 && floor(var.refresh_max_healthy_percentage) == var.refresh_max_healthy_percentage
    error_message = "refresh_max_healthy_percentage must be a whole number from 100 to 200 (AWS's range)."
  }
}

# When a draining host's streams are cut. The longest reply a tier allows (4096 tokens, paid:
# edge/defaults.toml), placed up to the edges' discovery_interval_s (15 s) after the drain began,
# takes 527 s at 8 tokens a second (a large model at a full batch on a small GPU, or streams paused
# while the KV cache is full): 600 s covers it (tests/iac/test_structure.py checks it against the
# tiers). 300 s covered it only above 14 tokens a second. The host agent completes the hook as soon
# as the host's last stream ends, so a quiet host never waits this long.
variable "scale_in_drain_s" {
  description = "Longest a host leaving the pool waits (Terminating:Wait) for its running streams: 600 s, a paid tier's longest reply (4096 tokens) at 8 tokens a second. The host agent completes the hook as soon as they end, and the edge sends it no new work. 30 to 7200 s (AWS's heartbeat timeout)."
  type        = number
  default     = 600
  nullable    = false

  validation {
    condition     = var.scale_in_drain_s >= 30 && var.scale_in_drain_s <= 7200 && floor(var.scale_in_drain_s) == var.scale_in_drain_s
    error_message = "scale_in_drain_s must be a whole number of seconds from 30 to 7200 (a lifecycle hook's heartbeat timeout); cover the longest reply the tiers allow at a slow decode (4096 tokens at 8 tokens a second: 600 s by default)."
  }
}

variable "wait_for_capacity_timeout" {
  description = "How long apply waits for min_size hosts in service (engine download and load included); \"0\" does not wait."
  type        = string
  default     = "30m"
  nullable    = false
}

variable "log_retention_days" {
  description = "Retention of Triton's log group."
  type        = number
  default     = 365
}

variable "host_metric_namespace" {
  description = "CloudWatch namespace of the GPU metrics the host agent ships (the only one the hosts may publish to)."
  type        = string
  default     = "Floodgate/GPU"
}

variable "metric_namespace" {
  description = "Namespace of the scaling metric (module scaling_metric)."
  type        = string
}

variable "demand_metric" {
  description = "The edges' demand per replica (module scaling_metric), summed over the edges."
  type        = string
}

variable "replica_load_metric" {
  description = "The replicas' own reported load per replica (module scaling_metric), the same at every edge."
  type        = string
}

variable "metric_model_dimension" {
  description = "Dimension carrying the model's name (module scaling_metric)."
  type        = string
}

variable "metric_period_s" {
  description = "Aggregation period of the scaling metric (module scaling_metric)."
  type        = number
}

variable "metric_samples_per_period" {
  description = "Samples per period each edge sends (module scaling_metric)."
  type        = number
}
