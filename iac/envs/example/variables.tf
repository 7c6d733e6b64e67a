variable "region" {
  description = "AWS region (must offer the GPU instance types of var.models)."
  type        = string
  default     = "us-east-1"
}

variable "name" {
  description = "Deployment name, prefixed to every resource: lowercase letters, digits and single hyphens, from a letter to a letter or digit (the buckets and ECR repositories take no other)."
  type        = string
  default     = "floodgate"

  # S3 bucket names ("<name>-logs-…", "<name>-engines-…") and ECR repository names ("<name>/edge")
  # take lowercase letters and digits joined by single hyphens, and no check at plan time says so:
  # another name failed at apply, the VPC, key, tables and Redis already made. Its length is
  # checked at plan by the load balancer's target group ("<name>-edge", 32 characters at most).
  validation {
    condition     = can(regex("^[a-z]([a-z0-9]|-[a-z0-9])*$", var.name))
    error_message = "name must be lowercase letters, digits and single hyphens, starting with a letter and not ending with a hyphen (it prefixes S3 bucket and ECR repository names), e.g. \"floodgate-prod\"."
  }

  # S3 also reserves two prefixes a bucket "<name>-…" could start with ("xn--" needs a double
  # hyphen): "sthree" planned clean and CreateBucket refused "sthree-logs-…" at apply.
  validation {
    condition     = !startswith("${var.name}-", "sthree-") && !startswith("${var.name}-", "amzn-s3-demo-")
    error_message = "name may not be \"sthree\" or begin \"sthree-\" or \"amzn-s3-demo-\": S3 reserves those prefixes for bucket names, and it prefixes the log and engine buckets."
  }
}

variable "domain_name" {
  description = "Public name of the API, e.g. api.example.com."
  type        = string
}

variable "route53_zone_id" {
  description = "Route 53 hosted zone of domain_name."
  type        = string
}

variable "alarm_emails" {
  description = "Who gets the alarms."
  type        = list(string)
  default     = []
}

variable "edge_image_tag" {
  description = "Tag of the edge image pushed to the edge repository."
  type        = string
}

variable "triton_image_tag" {
  description = "Tag of the Triton + TensorRT-LLM image pushed to the triton repository."
  type        = string
}

variable "edge_model_dir" {
  description = "Where the edge image holds the served model's config.json and tokenizer files."
  type        = string
  default     = "/opt/floodgate/model"
}

variable "models" {
  description = "Served models, by the name clients pass (dots allowed, e.g. llama-3.1-8b; its GPU group is named from it with every character but letters, digits, '-' and '_' made a '-'): each gets its own GPU Auto Scaling group, scaled on its own demand (the metric's Model dimension), and its own [models.NAME] in the edge's settings. engine_prefix is the engine's key prefix in the engine bucket, built for instance_type's GPU. ami_id pins the GPU AMI (empty: the latest, read at plan time). min_size may be 0: the group then starts from zero on demand. edge_model_dir: where the edge image holds this model's config and tokenizer files (empty: edge_model_dir; with several models give each its own, /opt/floodgate/model/NAME: the image built with MODEL_DIR a folder of one folder per model, docs/deploy.md). token_weight: what each of its tokens counts against a user's token limit. max_model_len: the longest prompt + completion, its engine's build --max-seq-len (default 8192, build_engine.py's). prefill_s_per_token, decode_s_per_token: seconds of one of its replicas per prompt token and per output token at a full batch, what its requests cost in its own scaling demand (unset: the edge's [metrics] defaults, one H200 serving Llama 3.3 70B FP8; docs/deploy.md, What scales on what). root_volume_gb, root_volume_iops, root_volume_throughput_mibps: its hosts' gp3 root volume, which holds the image and the engine (default 200 GiB, 6000 IOPS, 1000 MiB/s: a warm-pool host re-reads its whole engine at start). surge_demand: demand per replica past which a step policy adds 50 % / 100 % of the group (default 1.5; above demand_target, which must be above 0 and at most 1: the plan refuses the rest). scale_in_drain_s: longest a host leaving the group waits for its streams (default 600: a paid tier's longest reply, 4096 tokens, at 8 tokens a second; 30 to 7200). wait_for_capacity_timeout: how long apply waits for min_size hosts in service (default \"30m\"; \"0\" does not wait)."
  type = map(object({
    instance_type      = string
    engine_prefix      = string
    min_size           = number
    max_size           = number
    warm_pool_min_size = number
    demand_target      = number
    ami_id             = optional(string, "")
    edge_model_dir     = optional(string, "")
    token_weight       = optional(number, 1)
    # The longest prompt + completion its replicas hold: its engine's build --max-seq-len
    # (build_engine.py's default 8192). The edge refuses a longer request with a 400.
    max_model_len = optional(number, 8192)
    # Seconds of one of its replicas per prompt token and per output token at a full batch: the
    # price of its requests in its own scaling demand (null: the edge's [metrics] defaults).
    prefill_s_per_token = optional(number)
    decode_s_per_token  = optional(number)
    # The GPU hosts' root volume (null: the gpu_pool module's defaults, 200 GiB, 6000 IOPS,
    # 1000 MiB/s): it holds the image and the engine, which a warm-pool host re-reads at start.
    root_volume_gb               = optional(number)
    root_volume_iops             = optional(number)
    root_volume_throughput_mibps = optional(number)
    # Scaling and rollout of its group (null: the gpu_pool module's defaults, 1.5, 600 s, "30m").
    surge_demand              = optional(number)
    scale_in_drain_s          = optional(number)
    wait_for_capacity_timeout = optional(string)
  }))
  default = {
    "llama-3-8b" = {
      instance_type      = "g6e.xlarge"
      engine_prefix      = "engines/llama-3-8b/l40s/"
      min_size           = 1
      max_size           = 8
      warm_pool_min_size = 2
      demand_target      = 0.8
    }
  }

  # Rendered with no [models.*], the edge's settings would fall back to its built-in defaults
  # (edge/defaults.toml): the random-weight demo model and SmolLM2 on CPU engines inside the task,
  # and no GPU group would exist.
  validation {
    condition     = length(var.models) > 0
    error_message = "models must name at least one model: with none the edge would serve its built-in demo models on CPU, not a GPU group."
  }

  # The edge refuses a served model's name that is empty, has a '/' or is '.' or '..' (it is one
  # segment of /v1/models/{id}): every task would crash-loop on its settings.
  validation {
    condition     = alltrue([for model in keys(var.models) : model != "" && !strcontains(model, "/") && !contains([".", ".."], model)])
    error_message = "A model's name must be non-empty, have no '/' and not be '.' or '..': name it, say, \"llama-3.1-8b\" and keep the checkpoint's own name in its engine_prefix and edge_model_dir."
  }

  # engine_prefix is a key prefix in the engine bucket, as `aws s3 cp --recursive` uploads keys: a
  # leading '/' (or a '//') made s3://bucket//engines/..., whose keys start with '/', which the hosts
  # fetched as an empty engine and the instance role's grant named no uploaded object.
  validation {
    condition     = alltrue([for spec in values(var.models) : !startswith(spec.engine_prefix, "/") && !strcontains(spec.engine_prefix, "//")])
    error_message = "A model's engine_prefix is a key prefix in the engine bucket, with no leading '/' and no '//': say, \"engines/llama-3-8b/l40s/\"."
  }

  # The edge publishes each model's scaling metrics with its name as their Model dimension, which
  # CloudWatch takes in printable ASCII with something besides spaces: it refuses any other name.
  validation {
    condition     = alltrue([for model in keys(var.models) : can(regex("^[ -~]*[!-~][ -~]*$", model))])
    error_message = "A model's name must be printable ASCII with something besides spaces (CloudWatch's rule for the Model dimension its scaling metrics carry): name it, say, \"llama-3.1-8b\"."
  }

  # The edge refuses a negative prefill price or a decode price that is not positive.
  validation {
    condition = alltrue([
      for spec in values(var.models) :
      (spec.prefill_s_per_token == null ? true : spec.prefill_s_per_token >= 0) &&
      (spec.decode_s_per_token == null ? true : spec.decode_s_per_token > 0)
    ])
    error_message = "A model's prefill_s_per_token must be at least 0 and its decode_s_per_token above 0 (seconds of one replica per token at a full batch), or unset for the edge's defaults."
  }

  # The edge refuses a token_weight of 0 or less and a max_model_len that is not a whole number of at
  # least 1 (8192.5 renders as a TOML float): every task would crash-loop on its settings.
  validation {
    condition = alltrue([
      for spec in values(var.models) :
      spec.token_weight > 0 && spec.max_model_len >= 1 && floor(spec.max_model_len) == spec.max_model_len
    ])
    error_message = "A model's token_weight must be above 0 (what each of its tokens counts against a user's token limit) and its max_model_len a whole number of at least 1 (its engine's build --max-seq-len)."
  }

  # Each model's GPU group is named from its name with every character but [A-Za-z0-9_-] made a '-'
  # (main.tf, local.gpu_groups): two names that differ only there would share one group.
  validation {
    condition     = length(distinct([for model in keys(var.models) : replace(model, "/[^A-Za-z0-9_-]/", "-")])) == length(var.models)
    error_message = "Two model names differ only in characters other than letters, digits, '-' and '_' (e.g. \"llama-3.1-8b\" and \"llama-3-1-8b\"): their GPU groups would have the same name. Rename one."
  }
}

variable "availability_zones" {
  description = "Zones to span; pick zones that offer every GPU instance type in var.models."
  type        = list(string)
  default     = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

variable "single_nat_gateway" {
  description = "One NAT gateway instead of one per zone (cost lever for non-production)."
  type        = bool
  default     = false
}

variable "redis_node_type" {
  description = "ElastiCache node type of the limiter store."
  type        = string
  default     = "cache.r7g.large"
}

variable "redis_shards" {
  description = "Shards of the limiter store (1 to 500)."
  type        = number
  default     = 2
}

variable "edge_min_count" {
  description = "Fewest edge tasks (at least 1; at most edge_max_count). It is also the edge's [limiter] instance_count."
  type        = number
  default     = 2

  # The edge's settings take [limiter] instance_count from it, and the edge refuses 0: every task
  # would crash-loop on its settings. (Target tracking on CPU never starts a first task either.)
  validation {
    condition     = var.edge_min_count >= 1 && floor(var.edge_min_count) == var.edge_min_count
    error_message = "edge_min_count must be a whole number of at least 1 (the edge's [limiter] instance_count is rendered from it)."
  }
}

variable "edge_max_count" {
  description = "Most edge tasks."
  type        = number
  default     = 40
}

variable "deletion_protection" {
  description = "Protect the load balancer from deletion (turn off before destroying)."
  type        = bool
  default     = true
}

variable "create_autoscaling_service_linked_role" {
  description = "Create the Auto Scaling service-linked role the KMS key policy names; false where the account already has one (any Auto Scaling group ever made creates it)."
  type        = bool
  default     = true
}

variable "tier_models" {
  description = "Tier => the models of var.models it may use (the first is its default). A tier not named here may use every model, the alphabetically first by default."
  type        = map(list(string))
  default     = {}

  validation {
    condition     = alltrue([for models in values(var.tier_models) : length(models) > 0])
    error_message = "Each tier in tier_models needs at least one model."
  }

  # The edge defines its tiers' limits (edge/defaults.toml [tiers.*]); a tier it does not define
  # would reach it without them and be refused at start, every task crash-looping. That the models
  # are among var.models is checked by the tier_models output (a validation here may only read this
  # variable before Terraform 1.9).
  validation {
    condition     = alltrue([for tier in keys(var.tier_models) : contains(["free", "paid"], tier)])
    error_message = "tier_models may only name the tiers the edge defines: free, paid (edge/defaults.toml [tiers.*])."
  }
}

variable "metrics_scraper_security_group_ids" {
  description = "Security groups in the VPC (a Prometheus, a bastion) that may reach the edge tasks' operator endpoints, /metrics and /v1/internal/engine, on the edge's ops_port (output edge_ops_port). Empty: no rule, none may."
  type        = list(string)
  default     = []
}

variable "log_retention_days" {
  description = "Days the log groups keep their logs: the edge's, Triton's on every GPU host, the WAF's, Redis' slow log and the VPC flow logs."
  type        = number
  default     = 365
}

variable "noncurrent_version_days" {
  description = "Days a replaced engine version stays in the engine bucket, for rollback."
  type        = number
  default     = 30
}

variable "interface_endpoints" {
  description = "AWS services the private subnets reach through interface endpoints instead of the NAT (each costs per zone-hour: drop one whose traffic is small)."
  type        = list(string)
  default     = ["ecr.api", "ecr.dkr", "logs", "monitoring", "secretsmanager", "sts", "autoscaling"]
}

variable "deregistration_delay_s" {
  description = "Seconds the load balancer keeps a stopping edge task's open streams, and the edge's own [server] drain_deadline_s (rendered from it): a stream gets the same time whichever way its task stops. At least the edge's drain_accept_s (15), at most the task's stopTimeout (120, Fargate's maximum) less 5 s, so the edge ends its streams before SIGKILL (docs/deploy.md, Graceful drain)."
  type        = number
  default     = 90

  validation {
    condition     = var.deregistration_delay_s >= 15 && var.deregistration_delay_s <= 115
    error_message = "deregistration_delay_s must be from 15 (the edge's drain_accept_s) to 115 s (the task's stopTimeout, 120 s at most on Fargate, less 5 s for the edge to end its streams)."
  }
}

variable "members_per_replica" {
  description = "The edge's [fleet] members_per_replica (K): each GPU replica divided among K edge processes, each holding 1 / K of it, instead of among every process (0, the default). Not derived from the fleet's sizes: K is fixed while the edge service and the GPU groups scale, and a process among none of a model's replicas answers that model's requests 503 no_replica, so a K sized for the groups' max_size left most processes among none once the groups scaled in. docs/deploy.md, Edges that count themselves, says how to size it."
  type        = number
  default     = 0

  # The edge refuses a negative K, and a fraction renders as a TOML float it refuses too: every
  # task would crash-loop on its settings.
  validation {
    condition     = try(var.members_per_replica >= 0 && floor(var.members_per_replica) == var.members_per_replica, false)
    error_message = "members_per_replica must be a whole number of at least 0 (0: every edge process divides every replica)."
  }
}
