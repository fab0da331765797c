"""The tags that computes put on their stages and schedule templates match: the one vocabulary between
compiler/compute/ and compiler/schedules/. A template is chosen by its group's anchor, the reduction whose tag
names a tiled template (schedules/dispatch.py); a whole-group template (Winograd, Attention) by one stage's tag.
A new op that wants a template of its own adds its tag here, sets it in its compute and names it in the template
table (docs/adding_an_op.md)."""

# Generic stages: a schedule inlines elementwise, broadcast and injective stages into their readers; "reduce" is any
# reduction without a template of its own (the row and plane reduction templates), "layer_norm" a normalisation's
# last stage, "layout_nchw" a conversion back to NCHW (a loop order of its own)
ELEMWISE = "elemwise"
BROADCAST = "broadcast"
INJECTIVE = "injective"
REDUCE = "reduce"
LAYER_NORM = "layer_norm"
LAYOUT_NCHW = "layout_nchw"
GLOBAL_POOL = "global_pool"

# Convolutions: NCHW convs ("group_" when grouped, "depthwise_" when each channel has its own filters), their
# NCHW[x]c forms, and the transposed conv
CONV1D = "conv1d"
GROUP_CONV1D = "group_conv1d"
CONV2D = "conv2d"
GROUP_CONV2D = "group_conv2d"
DEPTHWISE_CONV2D = "depthwise_conv2d"
CONV2D_NCHWC = "conv2d_nchwc"
DEPTHWISE_CONV2D_NCHWC = "depthwise_conv2d_nchwc"
CONV2D_TRANSPOSE_NCHWC = "conv2d_transpose_nchwc"

# Winograd convs: the input transform (and its rows), the per-point matmuls, the output transform (and its columns)
WINOGRAD_ROWS = "winograd_rows"
WINOGRAD_INPUT = "winograd_input"
WINOGRAD_GEMM = "winograd_gemm"
WINOGRAD_OUTPUT = "winograd_output"
WINOGRAD_COLUMNS = "winograd_columns"

# Matrix products: a MatMul/Gemm (its split-K partial sums "dense_partial"), a batched MatMul, and a MatMulPacked
# (B packed into column panels at compile time)
DENSE = "dense"
DENSE_PARTIAL = "dense_partial"
BATCH_MATMUL = "batch_matmul"
DENSE_PACKED = "dense_packed"
# a MatMulPacked's narrow weight widened to the product's dtype (levels shifted and scaled): inlined into the product,
# or made a panel at a time into a local buffer that every row tile of the panel then reads
DENSE_WEIGHT = "dense_weight"

# Attention: the scores Q K^T, their row maximum, the exponentials, their row sum, and the product with V
ATTENTION_SCORES = "attention_scores"
ATTENTION_MAX = "attention_max"
ATTENTION_EXP = "attention_exp"
ATTENTION_SUM = "attention_sum"
ATTENTION = "attention"

# Pools with a window (a global pool is GLOBAL_POOL)
POOL_MAX = "pool_max"
POOL_AVG = "pool_avg"

# The families a template matches by
CONV_TAGS = (CONV2D, GROUP_CONV2D)
CONV1D_TAGS = (CONV1D, GROUP_CONV1D)
BLOCKED_CONV_TAGS = (CONV2D_NCHWC, DEPTHWISE_CONV2D_NCHWC)
DENSE_TAGS = (DENSE, BATCH_MATMUL)
POOL_TAGS = (POOL_MAX, POOL_AVG)
