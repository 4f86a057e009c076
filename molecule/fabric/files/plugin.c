/* Stands for aws-ofi-nccl's library: a shared object named as the plugin is. */
int provision_efa_stand_in(void) { return 0; }
