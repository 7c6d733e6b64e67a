terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.70, < 6.0"
    }
  }

  # Keep state in S3 with locking for anything shared, e.g.:
  # backend "s3" { bucket = "my-tf-state" key = "floodgate/example.tfstate" region = "us-east-1" use_lockfile = true encrypt = true }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = {
      Project     = "floodgate"
      Environment = var.name
    }
  }
}
