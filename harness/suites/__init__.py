"""What is tested, apart from the backends it runs on: PyTorch's OpInfo samples (``opinfo``) and its
nn module database (``modules``); ``cell`` runs a shard of either in an isolated child process."""
