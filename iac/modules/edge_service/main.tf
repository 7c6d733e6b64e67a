# The edge: stateless Fargate tasks behind the ALB, scaled on CPU (tokenising and SSE framing are the
# edge's work; the GPU pool scales separately on demand per replica, edge/scaling/).

data "aws_region" "current" {}

locals {
  # One edge process per vCPU (`floodgate serve --workers`, edge/workers.py): one process is one
  # event loop on one core, so a single one left the task's other vCPUs idle, and the service's CPU
  # target (cpu_target_percent of the whole task) was reached only once that loop was saturated.
  workers = max(1, floor(var.cpu / 1024))
  # Worker i's operator listener is ops_port + i (edge/workers.py, worker_overrides).
  ops_ports = range(var.ops_port, var.ops_port + local.workers)
}

resource "aws_cloudwatch_log_group" "edge" {
  name              = "/floodgate/${var.name}/edge"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_security_group" "edge" {
  name        = "${var.name}-edge"
  description = "Edge tasks: traffic from the ALB in; Redis, GPU replicas and AWS APIs out"
  vpc_id      = var.vpc_id

  ingress {
    description     = "From the load balancer"
    from_port       = var.container_port
    to_port         = var.container_port
    protocol        = "tcp"
    security_groups = [var.alb_security_group_id]
  }

  # The operator listener (/metrics, /v1/internal/engine) from the groups named for it, inside the
  # VPC; no rule at all when none is. (Inline like the rest: a separate rule resource beside inline
  # rules would be removed by them at the next apply.)
  dynamic "ingress" {
    for_each = length(var.metrics_scraper_security_group_ids) > 0 ? [var.metrics_scraper_security_group_ids] : []
    content {
      description     = "Operator endpoints (/metrics) of every worker from the scrapers"
      from_port       = var.ops_port
      to_port         = var.ops_port + local.workers - 1
      protocol        = "tcp"
      security_groups = ingress.value
    }
  }

  egress {
    description = "Redis"
    from_port   = 6379
    to_port     = 6379
    protocol    = "tcp"
    cidr_blocks = [var.vpc_cidr_block]
  }

  # Triton's HTTP and metrics ports, not its gRPC port 8001 between them (the edge speaks no gRPC).
  egress {
    description = "Triton HTTP (the streams) on the GPU hosts"
    from_port   = 8000
    to_port     = 8000
    protocol    = "tcp"
    cidr_blocks = [var.vpc_cidr_block]
  }

  egress {
    description = "Triton metrics (replica load) on the GPU hosts"
    from_port   = 8002
    to_port     = 8002
    protocol    = "tcp"
    cidr_blocks = [var.vpc_cidr_block]
  }

  egress {
    description = "AWS APIs (VPC endpoints, or the NAT for the rest)"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

# The API keys file (SHA-256 hashes, one JSON object per line, as `floodgate keys create` writes it)
# lives in Secrets Manager; its value is managed outside Terraform and read when a task starts.
resource "aws_secretsmanager_secret" "api_keys" {
  #checkov:skip=CKV2_AWS_57:holds hashes of API keys, revoked by editing the list, not rotated by a Lambda
  name                    = "${var.name}/api-keys"
  description             = "Hashed API keys of the edge (keys.jsonl)"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret_version" "api_keys" {
  secret_id     = aws_secretsmanager_secret.api_keys.id
  secret_string = "\n"

  lifecycle {
    ignore_changes = [secret_string]
  }
}

resource "aws_ecs_task_definition" "edge" {
  family                   = "${var.name}-edge"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  # A Fargate bind mount: root-owned 0755 unless the image declares the path a VOLUME, owned by its
  # user (Dockerfile.edge does), in which case the mount takes the image's ownership.
  volume {
    name = "run"
  }

  container_definitions = jsonencode([
    {
      name                   = "edge"
      image                  = var.image
      essential              = true
      readonlyRootFilesystem = true
      # scripts/edge-start.sh in the image: writes the settings (with the Redis token spliced in)
      # and the keys file into the task volume, refuses to start without keys, execs the server.
      command     = ["floodgate-start"]
      stopTimeout = var.stop_timeout_s
      # An init as PID 1 that passes SIGTERM on: the kernel drops a signal PID 1 has no handler
      # for, and the edge, exec'd by the start script, has none until its Python imports are done
      # (edge/stop_before_serving.py covers the rest of its start): a task stopped then served on
      # until SIGKILL at stopTimeout. The init also reaps what a killed worker leaves behind.
      linuxParameters = { initProcessEnabled = true }
      # The public API (the load balancer's target) and each worker's operator listener.
      portMappings = concat(
        [{ containerPort = var.container_port, protocol = "tcp" }],
        [for port in local.ops_ports : { containerPort = port, protocol = "tcp" }],
      )
      # Two sockets per stream through Triton (the client's, the replica's): Fargate's default,
      # said here so it is not lost; the edge holds max_open_streams to it (edge/open_files.py).
      ulimits     = [{ name = "nofile", softLimit = 65535, hardLimit = 65535 }]
      mountPoints = [{ sourceVolume = "run", containerPath = "/run/floodgate", readOnly = false }]
      environment = [
        for k, v in merge(var.environment, {
          FLOODGATE_CONFIG_TOML = var.config_toml
          # The start script's `floodgate serve --workers` (scripts/edge-start.sh).
          FLOODGATE_WORKERS = tostring(local.workers)
          AWS_REGION        = data.aws_region.current.name
          # boto3 reads AWS_DEFAULT_REGION, never AWS_REGION: the keys and messages tables'
          # clients name no region of their own (as the GPU hosts' containers, user_data.sh.tftpl).
          AWS_DEFAULT_REGION = data.aws_region.current.name
        }) : { name = k, value = v }
      ]
      secrets = [
        { name = "REDIS_AUTH_TOKEN", valueFrom = var.redis_auth_secret_arn },
        { name = "FLOODGATE_KEYS_JSONL", valueFrom = aws_secretsmanager_secret.api_keys.arn },
      ]
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.edge.name
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = "edge"
        }
      }
    }
  ])
}

resource "aws_ecs_service" "edge" {
  name            = "edge"
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.edge.arn
  desired_count   = var.min_count
  launch_type     = "FARGATE"
  # A task whose Redis is out of reach from its start listens on the traffic port (which /healthz is
  # checked on) only once its fleet membership falls back, [fleet] stale_after_s (30 s) and up to two
  # beats later, and the ALB then wants two passing checks 10 s apart: about 85 s at worst. At 60 s
  # such a task could still be unhealthy when ECS began to judge it, and was replaced (docs/deploy.md).
  health_check_grace_period_seconds = 120
  propagate_tags                    = "SERVICE"

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.edge.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = var.target_group_arn
    container_name   = "edge"
    container_port   = var.container_port
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  lifecycle {
    # Target tracking owns the count once the service exists.
    ignore_changes = [desired_count]
  }

  # ECS may pull the image, write its logs and read its secrets before it starts the first tasks.
  depends_on = [aws_iam_role_policy.execution_pull_and_log, aws_iam_role_policy.execution_secret]
}

resource "aws_appautoscaling_target" "edge" {
  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.this.name}/${aws_ecs_service.edge.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.min_count
  max_capacity       = var.max_count

  lifecycle {
    # RegisterScalableTarget refuses it, but only once the ECS service exists: an apply that
    # stops half-way.
    precondition {
      condition     = var.min_count <= var.max_count
      error_message = "min_count may be at most max_count (the fewest and the most edge tasks)."
    }
  }
}

resource "aws_appautoscaling_policy" "edge_cpu" {
  name               = "${var.name}-edge-cpu"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.edge.service_namespace
  resource_id        = aws_appautoscaling_target.edge.resource_id
  scalable_dimension = aws_appautoscaling_target.edge.scalable_dimension

  target_tracking_scaling_policy_configuration {
    target_value = var.cpu_target_percent
    # Scale in slowly: a removed task takes its open streams' drain time with it.
    scale_in_cooldown  = 300
    scale_out_cooldown = 60

    predefined_metric_specification {
      predefined_metric_type = "ECSServiceAverageCPUUtilization"
    }
  }
}
