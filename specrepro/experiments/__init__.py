"""The reproduction's experiments: workloads, results files and records, the functions the notebooks call,
`reproduce` (papermill over the notebooks), plots, and the tree-tau tool."""
