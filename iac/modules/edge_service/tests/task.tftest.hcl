# The edge task planned against a mocked AWS provider: it runs the image's start script, and a
# stopping task gets the time the edge's graceful drain needs.

mock_provider "aws" {
  override_during = plan

  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::111122223333:role/mock" }
  }
  mock_resource "aws_secretsmanager_secret" {
    defaults = { arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:mock" }
  }
}

variables {
  name                  = "fg"
  vpc_id                = "vpc-1"
  vpc_cidr_block        = "10.0.0.0/16"
  private_subnet_ids    = ["subnet-a"]
  alb_security_group_id = "sg-alb"
  target_group_arn      = "arn:aws:elasticloadbalancing:us-east-1:111122223333:targetgroup/fg-edge/abc"
  image                 = "111122223333.dkr.ecr.us-east-1.amazonaws.com/fg/edge:1"
  ecr_repository_arn    = "arn:aws:ecr:us-east-1:111122223333:repository/fg/edge"
  config_toml           = "[server]\n"
  redis_auth_secret_arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:redis"
  messages_table_arn    = "arn:aws:dynamodb:us-east-1:111122223333:table/fg-messages"
  metric_namespace      = "Floodgate"
  kms_key_arn           = "arn:aws:kms:us-east-1:111122223333:key/abc"
}

run "start_script_volume_and_stop_timeout" {
  command = plan

  assert {
    condition     = jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].command == ["floodgate-start"]
    error_message = "the task runs the image's start script (scripts/edge-start.sh), not an inline shell"
  }

  assert {
    condition     = !can(jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].entryPoint)
    error_message = "no entryPoint override: the image's own command line applies"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].mountPoints[0].containerPath == "/run/floodgate"
    error_message = "the settings volume is the path Dockerfile.edge declares a VOLUME"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].stopTimeout == 120
    error_message = "a stopping task gets Fargate's longest stop timeout for the edge's drain"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].linuxParameters.initProcessEnabled
    error_message = "an init is PID 1 and passes SIGTERM on: as PID 1 the starting edge's was dropped"
  }
}

# The operator listener (/metrics, /v1/internal/engine on ops_port) is reachable inside the VPC only
# from the security groups named for it: none by default, so no rule.
run "no_operator_access_unless_asked" {
  command = plan

  assert {
    condition     = [for rule in aws_security_group.edge.ingress : rule.from_port] == [8000]
    error_message = "without metrics_scraper_security_group_ids only the load balancer reaches the tasks"
  }

  assert {
    condition     = contains([for m in jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].portMappings : m.containerPort], 9464)
    error_message = "the task declares the operator port beside the public one"
  }
}

run "a_scraper_reaches_the_operator_port" {
  command = plan

  variables {
    metrics_scraper_security_group_ids = ["sg-0prometheus"]
  }

  assert {
    condition = one([
      for rule in aws_security_group.edge.ingress : rule.to_port == 9465 && rule.security_groups == toset(["sg-0prometheus"]) && length(coalesce(rule.cidr_blocks, [])) == 0
      if rule.from_port == 9464
    ])
    error_message = "the operator ports of both workers (2 vCPUs) admit the scraper's security group, and no address range"
  }

  assert {
    condition     = [for rule in aws_security_group.edge.ingress : rule.security_groups if rule.from_port == 8000] == [toset(["sg-alb"])]
    error_message = "the public port still admits the load balancer only"
  }
}

# One edge process per vCPU (edge/workers.py): worker i's operator listener is ops_port + i.
run "one_worker_per_vcpu" {
  command = plan

  variables {
    cpu    = 4096
    memory = 8192
  }

  assert {
    condition = [
      for e in jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].environment : e.value if e.name == "FLOODGATE_WORKERS"
    ] == ["4"]
    error_message = "a task of 4 vCPUs starts 4 workers (the start script's floodgate serve --workers)"
  }

  assert {
    condition     = output.workers == 4
    error_message = "the module says how many fleet members a task runs (the environment sizes [fleet] members_per_replica on it)"
  }

  assert {
    condition     = [for m in jsondecode(aws_ecs_task_definition.edge.container_definitions)[0].portMappings : m.containerPort] == [8000, 9464, 9465, 9466, 9467]
    error_message = "the task declares the public port and each worker's operator port"
  }
}

# RegisterScalableTarget refuses a minimum above the maximum, after the ECS service was created:
# an apply that stops half-way.
run "more_tasks_at_least_than_at_most" {
  command = plan

  variables {
    min_count = 8
    max_count = 4
  }

  expect_failures = [aws_appautoscaling_target.edge]
}

# The execution role (ECS's, to inject the Redis token and the keys file) could decrypt anything
# under the deployment's key, which also encrypts the tables, the engines, the GPU hosts' volumes,
# Redis and the logs: it may now decrypt only through Secrets Manager, which is all it needs.
run "the_execution_role_decrypts_only_its_secrets" {
  command = plan

  assert {
    condition = one([
      for s in data.aws_iam_policy_document.execution_secret.statement : [
        for c in s.condition : "${c.test} ${c.variable} ${join(",", c.values)}"
      ] if s.sid == "DecryptStartupSecrets"
    ]) == ["StringEquals kms:ViaService secretsmanager.us-east-1.amazonaws.com"]
    error_message = "The execution role may decrypt with the deployment's key only through Secrets Manager."
  }
}

# Inside the VPC the edge calls Redis and the GPU hosts' Triton on its HTTP port (the streams) and
# metrics port (each replica's load): not the range 8000-8002, which let it open Triton's gRPC port
# 8001 as well, a port it never uses (and the GPU hosts no longer admit).
run "the_edge_reaches_only_the_triton_ports_it_uses" {
  command = plan

  assert {
    condition = toset(flatten([
      for rule in aws_security_group.edge.egress : range(rule.from_port, rule.to_port + 1)
      if rule.cidr_blocks == tolist(["10.0.0.0/16"])
    ])) == toset([6379, 8000, 8002])
    error_message = "inside the VPC the edge reaches Redis (6379) and Triton's HTTP (8000) and metrics (8002) ports, and no other"
  }
}

# The execution role pulls the task's one image and writes its one log group. It had AWS's
# AmazonECSTaskExecutionRolePolicy: ECR pulls and log writes on "*", every repository and every log
# group of the account. Only ecr:GetAuthorizationToken, account-wide by design, keeps "*". (The log
# statement names the log group's ARN, unknown at plan: tests/iac/test_structure.py reads it.)
run "the_execution_role_pulls_its_image_only" {
  command = plan

  assert {
    condition = {
      for s in data.aws_iam_policy_document.execution_pull_and_log.statement : s.sid => s.resources if s.sid != "WriteEdgeLogs"
      } == {
      EcrLogin  = toset(["*"])
      PullImage = toset(["arn:aws:ecr:us-east-1:111122223333:repository/fg/edge"])
    }
    error_message = "the execution role pulls from the edge's repository only (the ECR login is account-wide)"
  }
}
