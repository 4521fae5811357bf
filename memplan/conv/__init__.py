"""Convolutions as planned decisions (mu-cuDNN, paper 003).

- `kernels`: what a convolution kernel is, and the kernels of a trace;
- `algos`: cuDNN's algorithm families, their workspace and work;
- `timemodel`, `fit`, `deepbench`: the family time model and its fit to DeepBench;
- `db`, `sources`, `cudnn`: the SQLite benchmark database and its three sources;
- `options`, `wr`, `wd`: configurations, Workspace Reuse (DP) and Workspace Division
  (Pareto fronts and a 0-1 ILP);
- `decide`: a trace's conv decisions under a policy and limit (what `ucudnn:wr|wd` plan).
"""
