# The hosts read their engine from one bucket, pull their image from one repository, report their
# own readiness and health to their own group (lifecycle hooks, instance health), and ship Triton's
# logs and GPU metrics to CloudWatch. Session Manager replaces SSH (its own actions, no SSM
# parameter). They set no scale-in protection (no autoscaling:SetInstanceProtection): the terminate
# hook's drain is what keeps a host's streams alive (gpu_container/triton/host_agent.py).
#
# Nothing here refers to the Auto Scaling group resource: the group is named by var.group_name,
# which is known before the group exists. A reference to aws_autoscaling_group.gpu would make
# Terraform create this policy after the group, while the group waits for hosts that need this
# policy to come up (ECR login, the launch hook): a deadlock that times out on every apply.

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "gpu" {
  name               = "${var.group_name}-host"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

resource "aws_iam_instance_profile" "gpu" {
  name = "${var.group_name}-host"
  role = aws_iam_role.gpu.name
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  group_arn = join(":", [
    "arn", data.aws_partition.current.partition, "autoscaling", data.aws_region.current.name,
    data.aws_caller_identity.current.account_id, "autoScalingGroup", "*", "autoScalingGroupName/${var.group_name}",
  ])
  engine_prefix = trimsuffix(join("/", slice(split("/", var.engine_s3_uri), 3, length(split("/", var.engine_s3_uri)))), "/")
  # The engine's objects: the whole bucket for an engine at its root (engine_prefix ""), where
  # "<bucket>//*" would match no key and every host would get 403 on the manifest.
  engine_objects = local.engine_prefix == "" ? "${var.engine_bucket_arn}/*" : "${var.engine_bucket_arn}/${local.engine_prefix}/*"
}

data "aws_iam_policy_document" "gpu" {
  statement {
    sid       = "ReadEngine"
    actions   = ["s3:GetObject"]
    resources = [local.engine_objects]
  }

  statement {
    sid       = "DecryptEngine"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${data.aws_region.current.name}.amazonaws.com"]
    }
  }

  statement {
    sid       = "PullImage"
    actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    resources = [var.ecr_repository_arn]
  }

  # GetAuthorizationToken is account-wide by design.
  statement {
    sid       = "EcrLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }

  # The host agent (gpu_container/triton/host_agent.py): completes the launch and terminate hooks,
  # marks the host unhealthy when Triton stays down.
  statement {
    sid = "ReportToOwnGroup"
    actions = [
      "autoscaling:CompleteLifecycleAction",
      "autoscaling:SetInstanceHealth",
    ]
    resources = [local.group_arn]
  }

  # The host agent, at its start and when the host's target state changes: whether a launch hook
  # waits for this host (Pending:Wait: also on its way out of a warm pool) or it is in service
  # already (the agent restarted: a reboot, a crashed container), where a dead Triton must be
  # marked Unhealthy at once, not after the launch's ready timeout. Describe actions
  # support no resource-level permission: "*" is the only resource they accept; it only reads.
  statement {
    sid       = "DescribeOwnLifecycle"
    actions   = ["autoscaling:DescribeAutoScalingInstances"]
    resources = ["*"]
  }

  # Triton's log stream (Docker's awslogs driver).
  statement {
    sid       = "ShipTritonLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.triton.arn}:*"]
  }

  # Session Manager (in place of SSH): the SSM agent registers the host (an EC2 instance of this
  # account and region) and opens its channels; ec2messages is the agent's command channel. This is
  # all the hosts do with SSM: they read no parameter (Terraform reads the AMI's at plan), so not
  # AWS's AmazonSSMManagedInstanceCore, which also grants ssm:GetParameter(s) on every parameter of
  # the account, and State Manager, inventory and patching, which nothing here uses.
  statement {
    sid       = "SessionManagerRegister"
    actions   = ["ssm:UpdateInstanceInformation"]
    resources = ["arn:${data.aws_partition.current.partition}:ec2:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:instance/*"]
  }

  # The channels have no resource-level permissions.
  statement {
    sid = "SessionManagerChannels"
    actions = [
      "ssmmessages:CreateControlChannel",
      "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel",
      "ssmmessages:OpenDataChannel",
      "ec2messages:AcknowledgeMessage",
      "ec2messages:DeleteMessage",
      "ec2messages:FailMessage",
      "ec2messages:GetEndpoint",
      "ec2messages:GetMessages",
      "ec2messages:SendReply",
    ]
    resources = ["*"]
  }

  # GPU metrics from Triton's metrics port. PutMetricData has no resource-level permissions: the
  # namespace condition is the fence.
  statement {
    sid       = "ShipGpuMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.host_metric_namespace]
    }
  }
}

resource "aws_iam_role_policy" "gpu" {
  name   = "gpu-host"
  role   = aws_iam_role.gpu.id
  policy = data.aws_iam_policy_document.gpu.json
}
