# One Auto Scaling group of GPU hosts per model. Each host runs the Triton + TensorRT-LLM container,
# which fetches the engine from S3 on its first start. Loading a model takes minutes, so a warm pool
# keeps hosts that already went through that, stopped: scaling out starts them instead.

data "aws_region" "current" {}

resource "aws_security_group" "gpu" {
  name        = var.group_name
  description = "GPU hosts of ${var.model}: Triton gRPC and metrics from the edge"
  vpc_id      = var.vpc_id

  ingress {
    description     = "Triton gRPC and metrics from the edge"
    from_port       = 8001
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
  image_id               = "resolve:ssm:${var.ami_ssm_parameter}"
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

  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
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
    hook_name     = "${var.group_name}-ready"
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = var.group_name, Model = var.model }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = var.group_name, Model = var.model }
  }
}

resource "aws_autoscaling_group" "gpu" {
  name                      = var.group_name
  vpc_zone_identifier       = var.private_subnet_ids
  min_size                  = var.min_size
  max_size                  = var.max_size
  health_check_type         = "EC2"
  health_check_grace_period = 900
  default_instance_warmup   = 300
  enabled_metrics           = ["GroupInServiceInstances", "GroupDesiredCapacity", "GroupPendingInstances", "GroupTerminatingInstances", "WarmPoolWarmedCapacity"]

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  # A host is in service only once Triton reports ready (see user data): until then the launch
  # waits on this hook, both on its first boot and when it leaves the warm pool.
  initial_lifecycle_hook {
    name                 = "${var.group_name}-ready"
    lifecycle_transition = "autoscaling:EC2_INSTANCE_LAUNCHING"
    default_result       = "ABANDON"
    heartbeat_timeout    = 1800
  }

  initial_lifecycle_hook {
    name                 = "${var.group_name}-drain"
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    default_result       = "CONTINUE"
    heartbeat_timeout    = var.scale_in_drain_s
  }

  warm_pool {
    pool_state                  = "Stopped"
    min_size                    = var.warm_pool_min_size
    max_group_prepared_capacity = var.warm_pool_max_prepared

    instance_reuse_policy {
      reuse_on_scale_in = true
    }
  }

  # A new launch template version (AMI, image, engine) replaces hosts a few at a time.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 90
      max_healthy_percentage = 120
      instance_warmup        = 300
      skip_matching          = true
      auto_rollback          = true
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
  }
}
