# Two roles: the execution role lets ECS pull the image, write logs and inject the secrets (each on
# this task's own repository, log group and secrets); the task role is what the edge's own code may
# do, and nothing more.

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-edge-execution"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

# What AWS's AmazonECSTaskExecutionRolePolicy grants, on this task's image and log group instead
# of "*": that policy lets the role pull every repository of the account and write into every log
# group (the GPU hosts' role is scoped the same way, gpu_pool/iam.tf).
data "aws_iam_policy_document" "execution_pull_and_log" {
  # GetAuthorizationToken is account-wide by design.
  statement {
    sid       = "EcrLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }

  statement {
    sid       = "PullImage"
    actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    resources = [var.ecr_repository_arn]
  }

  # The awslogs driver's calls, on the edge's own log group.
  statement {
    sid       = "WriteEdgeLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.edge.arn}:*"]
  }
}

resource "aws_iam_role_policy" "execution_pull_and_log" {
  name   = "pull-image-write-logs"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_pull_and_log.json
}

data "aws_iam_policy_document" "execution_secret" {
  statement {
    sid       = "ReadStartupSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.redis_auth_secret_arn, aws_secretsmanager_secret.api_keys.arn]
  }

  # The deployment's one key also encrypts the tables, the engines, the GPU volumes, Redis and the
  # logs: through Secrets Manager only, which is all that injecting the secrets needs.
  statement {
    sid       = "DecryptStartupSecrets"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "execution_secret" {
  name   = "read-startup-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secret.json
}

resource "aws_iam_role" "task" {
  name               = "${var.name}-edge-task"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "task" {
  # PutMetricData has no resource-level permissions: the namespace condition is the fence.
  statement {
    sid       = "PublishScalingMetric"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.metric_namespace]
    }
  }

  # What edge/messages/dynamodb.py calls, on the one table.
  statement {
    sid       = "MessagesTable"
    actions   = ["dynamodb:PutItem", "dynamodb:Query"]
    resources = [var.messages_table_arn]
  }

  # A conversation's lock is taken, renewed and given back, each a conditional UpdateItem
  # (edge/messages/dynamodb.py, lock_partition): only items of the lock partitions, never a message.
  # No DeleteItem: a release keeps the item (its newest message id, for the next taker).
  statement {
    sid       = "MessagesTableLocks"
    actions   = ["dynamodb:UpdateItem"]
    resources = [var.messages_table_arn]
    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["lock/*"]
    }
  }

  statement {
    sid       = "MessagesTableKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["dynamodb.${data.aws_region.current.name}.amazonaws.com"]
    }
  }

  # Replica discovery (edge/upstreams/asg_resolver.py): the GPU groups' in-service hosts and their
  # private IPs. Neither action supports resource-level permissions or a condition key that could
  # name the groups, so "*" is the only resource they accept; both only read.
  statement {
    sid       = "DiscoverGpuReplicas"
    actions   = ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"]
    resources = ["*"]
  }
}

resource "aws_iam_role_policy" "task" {
  name   = "edge"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json
}
