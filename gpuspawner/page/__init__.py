"""The spawn page's view: what each offering shows one user now, and the options a spawn may carry. Pure."""
