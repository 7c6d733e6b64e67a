# One Auto Scaling group of GPU hosts per model. Each host runs the Triton + TensorRT-LLM container,
# which fetches the engine from S3 on its first start. Loading a model takes minutes, so a warm pool
# keeps hosts that already went through that, stopped: scaling out starts them instead.

data "aws_region" "current" {}

# The AMI is an explicit ID in the launch template: pinned by var.ami_id, else read from the SSM
# parameter when Terraform plans. A new AMI is then a diff in the plan (and an instance refresh),
# never a silent change at the next launch, and rolling back is setting ami_id to the old ID.
data "aws_ssm_parameter" "ami" {
  count = var.ami_id == "" ? 1 : 0
  name  = var.ami_ssm_parameter
}

locals {
  ami_id = var.ami_id != "" ? var.ami_id : data.aws_ssm_parameter.ami[0].insecure_value
}

# Triton's own log, shipped by Docker's awslogs driver (the host agent logs here too).
resource "aws_cloudwatch_log_group" "triton" {
  name              = "/floodgate/${var.group_name}/triton"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

locals {
  # EC2 takes a security group's description in a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$*
  # only, and the model's name is any printable ASCII but '/': every other character made a '-'.
  # A name EC2 takes stays as it is (a new description replaces the group its hosts hold).
  sg_model = replace(var.model, "/[^A-Za-z0-9 ._:()#,@\\[\\]+=&;{}!$*-]/", "-")
}

resource "aws_security_group" "gpu" {
  name        = var.group_name
  description = "GPU hosts of ${local.sg_model}: Triton HTTP and metrics from the edge"
  vpc_id      = var.vpc_id

  # The two ports the edge uses (its [models.*] triton = "asg:GROUP:8000:8002"), not the range
  # 8000-8002 between them: Triton's gRPC port 8001 serves the same inference, model-control and
  # shared-memory APIs, and no client of the hosts speaks gRPC.
  ingress {
    description     = "Triton HTTP (the streams) from the edge"
    from_port       = 8000
    to_port         = 8000
    protocol        = "tcp"
    security_groups = [var.edge_security_group_id]
  }

  ingress {
    description     = "Triton metrics (replica load) from the edge"
    from_port       = 8002
    to_port         = 8002
    protocol        = "tcp"
    security_groups = [var.edge_security_group_id]
  }

  egress {
    description = "S3, ECR and the AWS APIs"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

resource "aws_launch_template" "gpu" {
  name_prefix            = "${var.group_name}-"
  image_id               = local.ami_id
  instance_type          = var.instance_type
  vpc_security_group_ids = [aws_security_group.gpu.id]
  update_default_version = true
  ebs_optimized          = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.gpu.arn
  }

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required"
    # Triton runs on the host's network, so one hop reaches the metadata service.
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled"
  }

  # The engine lives here and a warm-pool host re-reads all of it when it starts: throughput and
  # IOPS provisioned for that, not gp3's baseline (variables.tf says what each costs in time).
  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      throughput            = var.root_volume_throughput_mibps
      iops                  = var.root_volume_iops
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  user_data = base64encode(templatefile("${path.module}/user_data.sh.tftpl", {
    region        = data.aws_region.current.name
    registry      = split("/", var.triton_image)[0]
    image         = var.triton_image
    engine_s3_uri = var.engine_s3_uri
    group_name    = var.group_name
    ready_hook    = local.ready_hook
    drain_hook    = local.drain_hook
    ready_timeout = local.ready_timeout_s - 60
    drain_s       = var.scale_in_drain_s
    log_group     = aws_cloudwatch_log_group.triton.name
    metric_ns     = var.host_metric_namespace
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = var.group_name, Model = var.model }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = var.group_name, Model = var.model }
  }

  lifecycle {
    # gp3's ratios, which EC2 would only refuse when the group launches a host.
    precondition {
      condition     = var.root_volume_throughput_mibps <= var.root_volume_iops / 4
      error_message = "root_volume_throughput_mibps may be at most root_volume_iops / 4 (gp3: 0.25 MiB/s per provisioned IOPS; 1000 MiB/s needs 4000 IOPS)."
    }
    precondition {
      condition     = var.root_volume_iops <= 500 * var.root_volume_gb
      error_message = "root_volume_iops may be at most 500 per GiB of root_volume_gb (gp3)."
    }
  }
}

locals {
  ready_hook = "${var.group_name}-ready"
  drain_hook = "${var.group_name}-drain"
  # The launch hook's heartbeat; the host agent abandons the launch itself a minute before it.
  ready_timeout_s = 1800
  # The fewest hosts the group refreshes: a refresh that moves there moves at every larger size.
  refresh_smallest_group = max(var.min_size, 1)
}

resource "aws_autoscaling_group" "gpu" {
  name                      = var.group_name
  vpc_zone_identifier       = var.private_subnet_ids
  min_size                  = var.min_size
  max_size                  = var.max_size
  health_check_type         = "EC2"
  health_check_grace_period = 900
  default_instance_warmup   = 300
  # Terraform waits this long for min_size hosts in service (each downloads and loads the engine).
  wait_for_capacity_timeout = var.wait_for_capacity_timeout
  enabled_metrics           = ["GroupInServiceInstances", "GroupDesiredCapacity", "GroupPendingInstances", "GroupTerminatingInstances", "WarmPoolWarmedCapacity"]

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  # A host is in service only once Triton reports ready (the host agent completes this hook, or
  # abandons the launch when Triton never gets ready): on its first boot and when it leaves the
  # warm pool. An initial hook, so the very first hosts wait on it too; its settings are constants,
  # because changing an initial_lifecycle_hook replaces the whole group.
  initial_lifecycle_hook {
    name                 = local.ready_hook
    lifecycle_transition = "autoscaling:EC2_INSTANCE_LAUNCHING"
    default_result       = "ABANDON"
    heartbeat_timeout    = local.ready_timeout_s
  }

  # The pool keeps MaxGroupPreparedCapacity minus the hosts in service warm, at least min_size: at
  # min_size both, exactly min_size (unset, AWS's default is max_size minus those in service).
  warm_pool {
    pool_state                  = "Stopped"
    min_size                    = var.warm_pool_min_size
    max_group_prepared_capacity = coalesce(var.warm_pool_max_prepared, var.warm_pool_min_size)

    instance_reuse_policy {
      reuse_on_scale_in = true
    }
  }

  # A new launch template version (AMI, image, engine) replaces the hosts. AWS keeps
  # ceil(min % x desired) in service and at most max % x desired (whole hosts) in service or
  # pending: at 100 / 200 every replacement is launched (and has loaded its engine) before the
  # host it replaces drains, whatever the group's size, one host included.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = var.refresh_min_healthy_percentage
      max_healthy_percentage = var.refresh_max_healthy_percentage
      instance_warmup        = 300
      skip_matching          = true
      auto_rollback          = true
      # A host protected from scale-in (by hand: the hosts protect none) is still refreshed, its
      # terminate hook draining it.
      scale_in_protected_instances = "Refresh"
    }
  }

  tag {
    key                 = "Model"
    value               = var.model
    propagate_at_launch = true
  }

  lifecycle {
    # The scaling policies own the desired capacity.
    ignore_changes = [desired_capacity]

    # CreateAutoScalingGroup refuses it, but only once the launch template, the role and the log
    # group exist: an apply that stops half-way.
    precondition {
      condition     = var.min_size <= var.max_size
      error_message = "min_size may be at most max_size (the fewest and the most hosts in service)."
    }

    # A refresh moves only where it may launch a host first (max % of the group is a whole host
    # more) or take one out first (min % of it, rounded up, is a host less), at every size the
    # group may have: 90 / 120 at one host allows neither, and the refresh never replaces anything.
    # Both grow with the group's size, so its smallest (min_size, one host for a group from zero)
    # decides: checking from one host refused 100 / 150 for a group that never runs fewer than two,
    # and a range() over max_size failed past Terraform's 1024 values.
    precondition {
      condition = var.max_size < 1 || (
        floor(var.refresh_max_healthy_percentage * local.refresh_smallest_group / 100) > local.refresh_smallest_group ||
        ceil(var.refresh_min_healthy_percentage * local.refresh_smallest_group / 100) < local.refresh_smallest_group
      )
      error_message = "refresh_min_healthy_percentage and refresh_max_healthy_percentage leave an instance refresh stuck at the group's smallest size, min_size (one host for a group from zero; AWS rounds the minimum up and allows whole hosts only above the group's size): keep refresh_max_healthy_percentage at 200 (launch before draining, at one host too), or refresh_min_healthy_percentage at 0 (a single host is taken out first)."
    }
    precondition {
      condition     = var.refresh_max_healthy_percentage - var.refresh_min_healthy_percentage <= 100
      error_message = "refresh_max_healthy_percentage may lie at most 100 above refresh_min_healthy_percentage (AWS refuses a wider range)."
    }
  }

  # A host must be able to pull its image, read its engine and complete its launch hook before the
  # group waits for it: the role's policy first (its instance profile alone does not carry it).
  depends_on = [aws_iam_role_policy.gpu]
}

# The drain on scale-in: its own resource, so changing scale_in_drain_s updates the hook in place
# instead of replacing the group. The host agent completes it as soon as the host's last stream
# ends; the heartbeat timeout is only the upper bound.
resource "aws_autoscaling_lifecycle_hook" "drain" {
  name                   = local.drain_hook
  autoscaling_group_name = aws_autoscaling_group.gpu.name
  lifecycle_transition   = "autoscaling:EC2_INSTANCE_TERMINATING"
  default_result         = "CONTINUE"
  heartbeat_timeout      = var.scale_in_drain_s
}
