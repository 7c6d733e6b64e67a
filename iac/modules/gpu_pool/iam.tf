# The hosts read their engine from one bucket, pull their image from one repository, and report
# their own readiness to their own group. Session Manager replaces SSH.

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

resource "aws_iam_role_policy_attachment" "ssm" {
  role       = aws_iam_role.gpu.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

locals {
  engine_prefix = trimsuffix(join("/", slice(split("/", var.engine_s3_uri), 3, length(split("/", var.engine_s3_uri)))), "/")
}

data "aws_iam_policy_document" "gpu" {
  statement {
    sid       = "ReadEngine"
    actions   = ["s3:GetObject"]
    resources = ["${var.engine_bucket_arn}/${local.engine_prefix}/*"]
  }

  # The fetcher lists the engine's prefix to verify every file against its object.
  statement {
    sid       = "ListEngine"
    actions   = ["s3:ListBucket"]
    resources = [var.engine_bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.engine_prefix}/*"]
    }
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

  statement {
    sid       = "ReportReady"
    actions   = ["autoscaling:CompleteLifecycleAction"]
    resources = [aws_autoscaling_group.gpu.arn]
  }
}

resource "aws_iam_role_policy" "gpu" {
  name   = "gpu-host"
  role   = aws_iam_role.gpu.id
  policy = data.aws_iam_policy_document.gpu.json
}
